#!/usr/bin/env bash
# Build the real upstream containerd v2 (CRI with CDI, which the DRA scenarios need: Debian's
# containerd 1.6 has none), its runc shim and ctr from their Go module, pinned in go.mod beside
# this script, into a cache folder keyed by version:
#   ${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}/containerd-<version>/bin
# Nothing is rebuilt when that folder already holds every binary for this version. Needs only
# the Go module proxy; runc stays Debian's. Prints the folder on the last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

version="$(awk '$1 == "require" && $2 == "github.com/containerd/containerd/v2" {print $3} $1 == "github.com/containerd/containerd/v2" {print $2}' go.mod | head -n 1)"
cache_root="${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}"
dest="$cache_root/containerd-$version/bin"
binaries=(containerd containerd-shim-runc-v2 ctr)

missing=()
for b in "${binaries[@]}"; do [[ -x "$dest/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "containerd build: cached containerd $version in $dest" >&2
  echo "$dest"
  exit 0
fi

# What `containerd --version` reports, set as containerd's Makefile does. Static, cgo-free
# builds with the storage drivers that need C headers (btrfs, devmapper, zfs) left out: the
# suite uses the overlayfs snapshotter only.
pkg=github.com/containerd/containerd/v2
ldflags="-s -w -X $pkg/version.Version=$version -X $pkg/version.Revision=module-proxy"
ldflags+=" -X $pkg/version.Package=$pkg"
tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs no_devmapper no_zfs"

tmp="$dest.partial"
rm -rf "$tmp"; mkdir -p "$tmp"
start=$SECONDS
echo "containerd build: downloading modules for containerd $version" >&2
go mod download
for b in "${binaries[@]}"; do
  echo "containerd build: $b ($((SECONDS - start)) s so far)" >&2
  btags="$tags"
  # The shim as containerd's Makefile builds it: without the gRPC server (ttrpc only).
  [[ $b == containerd-shim-runc-v2 ]] && btags+=" no_grpc"
  CGO_ENABLED=0 go build -trimpath -tags "$btags" -ldflags "$ldflags" -o "$tmp/$b" "$pkg/cmd/$b"
done
rm -rf "$dest"; mv "$tmp" "$dest"
echo "containerd build: done in $((SECONDS - start)) s into $dest" >&2
echo "$dest"
