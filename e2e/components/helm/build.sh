#!/usr/bin/env bash
# Build the real upstream helm (the chart tests and the end-to-end suite run it) from its Go
# module, pinned in go.mod beside this script, into a cache folder keyed by version:
#   ${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}/helm-<version>/bin/helm
# Nothing is rebuilt when that folder already holds the binary for this version. Needs only the
# Go module proxy. Prints the binary's path on the last line of stdout. About 1.5 minutes on two
# cores after the components' build (which compiles the k8s.io packages it shares); instant warm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

helm_version="$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" {print $3} $1 == "helm.sh/helm/v3" {print $2}' go.mod | head -n 1)"
cache_root="${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}"
dest="$cache_root/helm-$helm_version/bin"

if [[ -x "$dest/helm" ]]; then
  echo "helm build: cached helm $helm_version in $dest" >&2
  echo "$dest/helm"
  exit 0
fi

# The version `helm version` reports and the Kubernetes version `helm lint`/`helm template`
# assume (.Capabilities.KubeVersion), set the way helm's own Makefile does: otherwise helm says
# v3.20 with no patch level and assumes Kubernetes v1.20.
client_go="$(go list -m -f '{{.Version}}' k8s.io/client-go)"   # v0.35.x
k8s_minor="${client_go#v0.}"; k8s_minor="${k8s_minor%%.*}"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done

tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp"
start=$SECONDS
echo "helm build: downloading modules for helm $helm_version" >&2
go mod download
echo "helm build: compiling helm $helm_version" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm
rm -rf "$dest"; mv "$tmp" "$dest"
echo "helm build: done in $((SECONDS - start)) s into $dest" >&2
echo "$dest/helm"
