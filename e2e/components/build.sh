#!/usr/bin/env bash
# Build the real upstream components the end-to-end suite runs (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kubectl) from their Go modules, pinned in
# go.mod beside this script, into a cache folder keyed by version:
#   ${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}/k8s-<version>-etcd-<version>/bin
# Nothing is rebuilt when that folder already holds every binary for these versions. Prints the
# folder on the last line of stdout. Takes minutes on 2 cores cold;
# seconds warm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2}' go.mod)"
etcd_version="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' go.mod)"
cache_root="${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}"
dest="$cache_root/k8s-$k8s_version-etcd-$etcd_version/bin"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

missing=()
for b in "${binaries[@]}"; do [[ -x "$dest/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "e2e build: cached k8s $k8s_version / etcd $etcd_version in $dest" >&2
  echo "$dest"
  exit 0
fi

# The version the binaries report (kubectl version, the Node's kubeletVersion, /version), set
# the way Kubernetes' own hack/lib/version.sh does: otherwise they say v0.0.0-master.
major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp"
start=$SECONDS
echo "e2e build: downloading modules for k8s $k8s_version / etcd $etcd_version" >&2
go mod download
# One package at a time, so progress is visible; the Go build cache shares every common
# package between them, so this costs no more than one combined build.
for b in "${binaries[@]}"; do
  case "$b" in
    etcd) pkg=./etcd ;;
    *) pkg="k8s.io/kubernetes/cmd/$b" ;;
  esac
  echo "e2e build: $b ($((SECONDS - start)) s so far)" >&2
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/$b" "$pkg"
done
rm -rf "$dest"; mv "$tmp" "$dest"
echo "e2e build: done in $((SECONDS - start)) s into $dest" >&2
echo "$dest"
