#!/usr/bin/env bash
# Build the real upstream KWOK controller (the scale replay's fake nodes, e2e/kubegpu_e2e/scale)
# from its Go module, pinned in go.mod beside this script, into a cache folder keyed by version:
#   ${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}/kwok-<version>/bin/kwok
# Nothing is rebuilt when that folder already holds the binary for this version. Needs only the
# Go module proxy. Prints the binary's path on the last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

kwok_version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/kwok" {print $3} $1 == "sigs.k8s.io/kwok" {print $2}' go.mod | head -n 1)"
cache_root="${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}"
dest="$cache_root/kwok-$kwok_version/bin"

if [[ -x "$dest/kwok" ]]; then
  echo "kwok build: cached kwok $kwok_version in $dest" >&2
  echo "$dest/kwok"
  exit 0
fi

tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp"
start=$SECONDS
echo "kwok build: downloading modules for kwok $kwok_version" >&2
go mod download
echo "kwok build: compiling kwok $kwok_version" >&2
# The version kwok reports, set as KWOK's own Makefile does.
CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_version" \
  -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok
rm -rf "$dest"; mv "$tmp" "$dest"
echo "kwok build: done in $((SECONDS - start)) s into $dest" >&2
echo "$dest/kwok"
