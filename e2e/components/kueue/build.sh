#!/usr/bin/env bash
# Build the real upstream Kueue manager (the gang-admission scenarios, e2e/tests/test_09_kueue.py)
# from its Go module, pinned in go.mod beside this script, into a cache folder keyed by version:
#   ${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}/kueue-<version>/bin/kueue
# with Kueue's own CRDs (config/components/crd/bases) and webhook configurations
# (config/components/webhook/manifests.yaml) copied from the same module beside it, in crd/ and
# webhook/, so that the folder is all a run needs. Nothing is rebuilt when that folder already
# holds them for this version. Needs only the Go module proxy. Prints the folder on the last
# line of stdout.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

kueue_version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/kueue" {print $3} $1 == "sigs.k8s.io/kueue" {print $2}' go.mod | head -n 1)"
cache_root="${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}"
dest="$cache_root/kueue-$kueue_version"

if [[ -x "$dest/bin/kueue" && -f "$dest/webhook/manifests.yaml" ]] && compgen -G "$dest/crd/*.yaml" >/dev/null; then
  echo "kueue build: cached kueue $kueue_version in $dest" >&2
  echo "$dest"
  exit 0
fi

tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp/bin" "$tmp/crd" "$tmp/webhook"
start=$SECONDS
echo "kueue build: downloading modules for kueue $kueue_version" >&2
go mod download
module_dir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
echo "kueue build: compiling kueue $kueue_version" >&2
# The version Kueue reports, set as Kueue's own Makefile does (no git commit: a module has none).
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version" \
  -o "$tmp/bin/kueue" sigs.k8s.io/kueue/cmd/kueue
cp "$module_dir"/config/components/crd/bases/*.yaml "$tmp/crd/"
cp "$module_dir/config/components/webhook/manifests.yaml" "$tmp/webhook/"
chmod -R u+w "$tmp"
rm -rf "$dest"; mv "$tmp" "$dest"
echo "kueue build: done in $((SECONDS - start)) s into $dest" >&2
echo "$dest"
