#!/usr/bin/env bash
# Build the project's own, unchanged Dockerfile into an OCI image archive with a real OCI builder
# (Debian's buildah), without Docker and without any container registry, for the end-to-end suite
# to import into containerd (`ctr -n k8s.io images import ARCHIVE` names it kubegpu.local/kubegpu:TAG):
#   ${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}/kubegpu-<tag>-<key12>.oci.tar (+ .json beside it)
#
# The Dockerfile's base (PYTHON_IMAGE, python:3.11-slim-bookworm on Docker Hub) cannot be pulled
# here, so an equivalent one is made from Debian packages with mmdebstrap (Debian's python3 3.11,
# python-is-python3 for the `python` the Dockerfile runs) and cached the same way:
#   .../python-base-<key12>.oci.tar, imported into buildah as kubegpu.local/python-base:3.11-bookworm-<key12>
# Both are keyed by their inputs (see base_key and image_key below); nothing is rebuilt when the
# archive for the current key exists. Prints the image archive's path on the last line of stdout.
#
#   build.sh [--tag TAG] [--bump-version VERSION]
#     --tag TAG                 image tag (default: the version in pyproject.toml)
#     --bump-version VERSION    build from a copy whose version (pyproject.toml and
#                               kubegpu.__version__, which `kubegpu --version` reports) is VERSION;
#                               the tag defaults to VERSION (the upgrade scenario's second image)
#
# Needs root (buildah's chroot isolation, mmdebstrap's root mode), the Debian mirror and PyPI (the
# Dockerfile's pip installs). About 1 minute for the base and 1 minute for the image cold on two
# cores; seconds warm.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
cache_root="${KUBEGPU_E2E_CACHE:-$HOME/.cache/kubegpu-e2e}"

log() { echo "image build: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# Any failing command not handled below still says where it failed before set -e exits non-zero.
trap 'log "FAILED (exit $?) at line $LINENO: $BASH_COMMAND"' ERR

usage() { sed -n '/^#   build.sh/,/^#$/s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
tag="" bump=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tag) [[ $# -ge 2 ]] || usage; tag="$2"; shift 2 ;;
    --bump-version) [[ $# -ge 2 ]] || usage; bump="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) log "unknown argument: $1"; usage ;;
  esac
done
version="$(awk -F'"' '/^version = /{print $2; exit}' "$repo/pyproject.toml")"
[[ -n $version ]] || die "no version = \"...\" in $repo/pyproject.toml"
if [[ -n $bump ]]; then
  [[ $bump =~ ^[0-9][0-9A-Za-z.!+-]*$ ]] || die "--bump-version $bump is not a version"
fi
tag="${tag:-${bump:-$version}}"
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "--tag $tag is not a valid image tag"
[[ $(id -u) -eq 0 ]] || die "needs root (buildah --isolation chroot, mmdebstrap root mode)"

# --- tools: installed only when missing (e2e/install-deps installs them up-front in CI) -------
need=()
for p in mmdebstrap buildah; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [[ ${#need[@]} -gt 0 ]]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # No fuse-overlayfs (buildah's Recommends): as root the kernel's overlay driver is used.
  # (uidmap, which buildah depends on, comes along; it is unused as root.)
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v git >/dev/null || die "needs git (the build context is the repository's file list)"
command -v python3 >/dev/null || die "needs python3 (reads the OCI archive for the .json)"

mkdir -p "$cache_root"
# One build at a time per cache: two e2e runs would otherwise race on the same archive names.
exec 9>"$cache_root/.image-build.lock"
flock 9

tmp="$(mktemp -d "${TMPDIR:-/tmp}/kubegpu-image.XXXXXX")"
containers=()   # buildah working containers this script made, removed on every exit
cleanup() {
  if [[ ${#containers[@]} -gt 0 ]]; then buildah rm "${containers[@]}" >/dev/null 2>&1 || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# archive_meta ARCHIVE OUT_JSON [key=value ...]: read an OCI archive (index.json, manifest,
# layers) and write OUT_JSON with its reference, sizes and the key=value fields (values parsed as
# JSON when they are JSON). With expect_ref=REF, fails unless the archive names exactly REF in
# org.opencontainers.image.ref.name, the annotation containerd's import names the image by.
archive_meta() {
  python3 - "$@" <<'PY'
import gzip, json, os, sys, tarfile
archive, out, *pairs = sys.argv[1:]
extra = {}
for kv in pairs:
    k, _, v = kv.partition("=")
    try:
        extra[k] = json.loads(v)
    except ValueError:
        extra[k] = v
expect = extra.pop("expect_ref", None)
with tarfile.open(archive) as t:
    blob = lambda d: t.extractfile("blobs/" + d.replace(":", "/"))
    manifests = json.load(t.extractfile("index.json"))["manifests"]
    if len(manifests) != 1:
        sys.exit(f"{archive}: expected one manifest in index.json, found {len(manifests)}")
    desc = manifests[0]
    ref = desc.get("annotations", {}).get("org.opencontainers.image.ref.name")
    if expect is not None and ref != expect:
        sys.exit(f"{archive}: index.json names {ref!r}, expected {expect!r}")
    layers = json.load(blob(desc["digest"]))["layers"]
    uncompressed = 0
    for layer in layers:
        f = blob(layer["digest"])
        if layer["mediaType"].endswith("+gzip"):
            f = gzip.GzipFile(fileobj=f)
        elif not layer["mediaType"].endswith(".tar"):
            sys.exit(f"{archive}: unexpected layer media type {layer['mediaType']}")
        while chunk := f.read(1 << 20):
            uncompressed += len(chunk)
meta = {"image": ref, "archive": archive, "archive_bytes": os.path.getsize(archive),
        "manifest_digest": desc["digest"], "layers": len(layers),
        "layers_compressed_bytes": sum(l["size"] for l in layers),
        "uncompressed_bytes": uncompressed, **extra}
with open(out, "w") as f:
    json.dump(meta, f, indent=2)
    f.write("\n")
PY
}
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
buildah_version="$(buildah --version | awk '{print $3}')"

# --- the base: Debian bookworm's python3 (3.11) in place of python:3.11-slim-bookworm ---------
# minbase (Essential, Priority: required and apt) is what debian:bookworm-slim, the base of
# python:3.11-slim, is made of; it also brings libstdc++6, which the manylinux wheels the
# Dockerfile installs (numpy, matplotlib, grpcio, ...) link against and the essential variant
# lacks. On top: what python:3.11-slim adds (ca-certificates, netbase, tzdata) and what the
# Dockerfile's RUN steps need: `python -m venv` (python3-venv, and python-is-python3 for
# `python`), groupadd/useradd (passwd).
base_packages=(python3 python3-venv python-is-python3 passwd ca-certificates netbase tzdata)
# The mirror the machine's own apt uses (its deb822 sources, security and updates included), so
# the versions the key is made of are the ones mmdebstrap installs.
mirror="${KUBEGPU_E2E_DEBIAN_SOURCES:-/etc/apt/sources.list.d/debian.sources}"
[[ -f $mirror ]] || mirror="http://deb.debian.org/debian"
mmdebstrap_args=(
  --variant=minbase "--include=$(IFS=,; echo "${base_packages[*]}")"
  # Mirrors pinned to a snapshot serve Release files past their Valid-Until; the host's apt is
  # configured the same way (mmdebstrap does not read the host's apt.conf.d).
  '--aptopt=Acquire::Check-Valid-Until "false"'
  # What debian:bookworm-slim (under python:3.11-slim) leaves out: docs but their copyrights,
  # man pages, info, translations.
  '--dpkgopt=path-exclude=/usr/share/doc/*' '--dpkgopt=path-include=/usr/share/doc/*/copyright'
  '--dpkgopt=path-exclude=/usr/share/man/*' '--dpkgopt=path-exclude=/usr/share/info/*'
  '--dpkgopt=path-exclude=/usr/share/locale/*'
)
base_config=(--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
             --env LANG=C.UTF-8 --cmd python3)
# The base's key: sha256 over this recipe (mmdebstrap and buildah config arguments, the mirror's
# sources, the architecture) and the candidate version apt reports (apt-cache show
# --no-all-versions) for every package it installs: minbase's set (Essential: yes, Priority:
# required, apt) and the included packages, with their dependency closure. A security update of any
# of them (libc6, python3.11, openssl, ...) is a new key, hence a new base. The versions are the
# host's apt lists' view: keep them fresh (apt-get update) for the key to follow the mirror.
apt_versions() {
  local minbase
  mapfile -t minbase < <(apt-cache dumpavail \
    | awk '/^Package:/{p=$2} /^Essential: yes/ || /^Priority: required/{print p}' | sort -u)
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances "${minbase[@]}" apt "${base_packages[@]}" \
    | grep -v '^[ <]' | sort -u | xargs apt-cache show --no-all-versions \
    | awk '/^Package:/{p=$2} /^Version:/{print p, $2}' | sort -u
}
base_key="$({
  echo "kubegpu python-base recipe 2"
  printf '%s\n' "${mmdebstrap_args[@]}" "${base_config[@]}" "$mirror"
  if [[ -f $mirror ]]; then cat "$mirror"; fi
  dpkg --print-architecture
  apt_versions
} | sha256sum | cut -c1-64)"
base_ref="kubegpu.local/python-base:3.11-bookworm-${base_key:0:12}"
base_archive="$cache_root/python-base-${base_key:0:12}.oci.tar"

# --- the build context: exactly the files the Dockerfile COPYs, no .venv, caches, egg-info ----
ctx="$tmp/context"
mkdir -p "$ctx"
(
  cd "$repo"
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || die "$repo is not a git work tree"
  # Tracked files and new ones git does not ignore; deleted-but-tracked ones are skipped.
  git ls-files -z --cached --others --exclude-standard -- \
      Dockerfile deploy/image/constraints.txt pyproject.toml README.md src \
    | while IFS= read -r -d '' f; do if [[ -f $f ]]; then printf '%s\0' "$f"; fi; done \
    | xargs -0 cp --parents -t "$ctx"
)
for f in Dockerfile deploy/image/constraints.txt pyproject.toml README.md src/kubegpu/__init__.py; do
  [[ -f $ctx/$f ]] || die "build context lacks $f"
done
if [[ -n $bump ]]; then
  # Both places the version lives: the wheel's metadata and what `kubegpu --version` prints.
  sed -i -E "0,/^version = \".*\"/s//version = \"$bump\"/" "$ctx/pyproject.toml"
  sed -i -E "s/^__version__ = \".*\"/__version__ = \"$bump\"/" "$ctx/src/kubegpu/__init__.py"
  grep -qx "version = \"$bump\"" "$ctx/pyproject.toml" || die "could not set the version in pyproject.toml"
  grep -qx "__version__ = \"$bump\"" "$ctx/src/kubegpu/__init__.py" \
    || die "could not set __version__ in src/kubegpu/__init__.py"
  version="$bump"
fi

bud_args=(--layers --force-rm --pull=never --isolation chroot -f Dockerfile
          --build-arg "PYTHON_IMAGE=$base_ref")
# The image's key: sha256 over every context file (Dockerfile, constraints.txt, pyproject.toml,
# README.md, src/**; path and content, after a --bump-version), the base's key, the tag and the
# buildah arguments above.
image_key="$({
  echo "kubegpu image recipe 1"
  printf '%s\n' "$base_key" "$tag" "${bud_args[@]}"
  (cd "$ctx" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
} | sha256sum | cut -c1-64)"
image_ref="kubegpu.local/kubegpu:$tag"
archive="$cache_root/kubegpu-$tag-${image_key:0:12}.oci.tar"

if [[ -f $archive && -f $archive.json ]]; then
  # Served from cache: the .json keeps the original build's seconds and says so.
  python3 - "$archive.json" "$(now)" <<'PY'
import json, sys
path, served = sys.argv[1:]
with open(path) as f:
    meta = json.load(f)
meta.update(cached=True, served_from_cache_at=served)
with open(path, "w") as f:
    json.dump(meta, f, indent=2)
    f.write("\n")
PY
  log "cached $image_ref (key ${image_key:0:12}) in $archive"
  echo "$archive"
  exit 0
fi

# --- ensure the base is in buildah's storage: already there, re-imported, or built -----------
if buildah inspect --type image "$base_ref" >/dev/null 2>&1; then
  log "base $base_ref already in buildah storage"
elif [[ -f $base_archive ]]; then
  log "importing base $base_ref from $base_archive"
  base_id="$(buildah pull --quiet "oci-archive:$base_archive")"
  buildah tag "$base_id" "$base_ref"
else
  log "building base $base_ref with mmdebstrap from $mirror"
  start=$SECONDS
  mmdebstrap "${mmdebstrap_args[@]}" bookworm "$tmp/rootfs.tar" "$mirror" >&2 \
    || die "mmdebstrap failed (see its output above)"
  # One layer: the rootfs tar, which `buildah add` unpacks as it copies.
  c="$(buildah from scratch)"; containers+=("$c")
  buildah add --quiet "$c" "$tmp/rootfs.tar" / >&2
  buildah config "${base_config[@]}" "$c" >&2
  buildah commit --quiet --rm "$c" "$base_ref" >&2; containers=()
  rm -f "$tmp/rootfs.tar"
  base_seconds=$((SECONDS - start))
fi
if [[ ! -f $base_archive ]]; then
  rm -f "$base_archive.partial"
  buildah push --quiet "$base_ref" "oci-archive:$base_archive.partial:$base_ref" >&2
  archive_meta "$base_archive.partial" "$base_archive.json" "expect_ref=$base_ref" \
    "archive=$base_archive" \
    "key=$base_key" "packages=$(IFS=,; echo "${base_packages[*]}")" \
    "build_seconds=${base_seconds:-null}" "buildah_version=$buildah_version" "date=$(now)"
  mv "$base_archive.partial" "$base_archive"
  log "base cached in $base_archive${base_seconds:+ (built in ${base_seconds} s)}"
fi

# --- build the Dockerfile as it is --------------------------------------------------------------
run_mounts=()
# The host's CA bundle over the base's during RUN steps only (not in any layer): pip must trust
# whatever TLS-intercepting proxy this machine's CA bundle trusts (Debian's pip and pip >= 24.2
# both read the system bundle). On a machine with a plain bundle it changes nothing.
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
  run_mounts+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi
log "building $image_ref (key ${image_key:0:12}) from $repo/Dockerfile on $base_ref"
start=$SECONDS
buildah bud "${bud_args[@]}" "${run_mounts[@]}" -t "$image_ref" "$ctx" >&2 \
  || die "buildah bud of $repo/Dockerfile failed (see its output above)"
build_seconds=$((SECONDS - start))

# Smoke check, in the built image as its own user: the uid, the version it was built from, the
# default command (`kubegpu --help`, which imports every subcommand), and every shared object in
# the virtualenv finding its libraries (a base that lacks one, as libstdc++6 once was, fails here).
# shellcheck disable=SC2016  # expanded inside the image, not here
smoke='set -e
kubegpu --help >/dev/null
unresolved="$(find /opt/kubegpu -name "*.so*" -type f -exec ldd {} + 2>/dev/null \
  | awk "/:\$/ {f=\$0} /not found/ {print f, \$1}")"
if [ -n "$unresolved" ]; then echo "unresolved libraries: $unresolved" >&2; exit 1; fi
echo "$(id -u) $(kubegpu --version)"'
c="$(buildah from --pull=never "$image_ref")"; containers+=("$c")
got="$(buildah run --isolation chroot "$c" -- sh -c "$smoke")" \
  || die "smoke check failed: the built image cannot run kubegpu (see above)"
buildah rm "$c" >/dev/null; containers=()
[[ $got == "65532 kubegpu, version $version" ]] \
  || die "the built image says '$got', expected '65532 kubegpu, version $version'"

rm -f "$archive.partial"
buildah push --quiet "$image_ref" "oci-archive:$archive.partial:$image_ref" >&2
archive_meta "$archive.partial" "$archive.json" "expect_ref=$image_ref" "archive=$archive" \
  "key=$image_key" "version=$version" "base=$base_ref" "base_key=$base_key" \
  "base_archive=$base_archive" "base_archive_bytes=$(stat -c %s "$base_archive")" \
  "base_uncompressed_bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["uncompressed_bytes"])' "$base_archive.json")" \
  "build_seconds=$build_seconds" "cached=false" "buildah_version=$buildah_version" "date=$(now)"
mv "$archive.partial" "$archive"
log "done in $build_seconds s: $image_ref in $archive"
echo "$archive"
