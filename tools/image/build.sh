#!/usr/bin/env bash
# Builds the sagapool image from the Dockerfile with podman, reaching nothing
# but Debian's package archive (what ./dev image and ./dev test run):
#   SAGA_IMAGE_DIR=build/image tools/image/build.sh
# 1. The Dockerfile's bases, debian:bookworm and debian:bookworm-slim, made
#    once with debootstrap (the project reaches no container registry), as Debian's
#    official images are: a minbase system; slim without documentation, man
#    pages and translations.
# 2. The image, tagged sagapool:VERSION (the CMake project version), with the
#    OCI labels for source, version and revision. It is reused while a hash
#    of what it is built from (the build context, the Dockerfile, the base)
#    matches its io.sagapool.source-hash label.
# Prints the image's reference on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=${SAGA_IMAGE_DIR:?SAGA_IMAGE_DIR names the folder of the image storage (./dev uses build/image)}
mkdir -p "$dir"
export SAGA_IMAGE_DIR=$(cd "$dir" && pwd)
dir=$SAGA_IMAGE_DIR
cd "$root"
podman() { "$here/podman.sh" "$@"; }
log() { printf '==> %s\n' "$*" >&2; }

version=$(sed -n 's/^project(sagapool VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || { echo "build.sh: no project version in CMakeLists.txt" >&2; exit 1; }
image=localhost/sagapool:$version

make_bases() {
  if podman image exists docker.io/library/debian:bookworm &&
     podman image exists docker.io/library/debian:bookworm-slim; then
    return 0
  fi
  local rootfs=$dir/debootstrap start=$SECONDS
  log "debootstrap --variant=minbase bookworm (the Dockerfile's bases)"
  rm -rf "$rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" ${SAGA_DEBIAN_MIRROR:+"$SAGA_DEBIAN_MIRROR"} \
    >"$dir/debootstrap.log" 2>&1 || { tail -20 "$dir/debootstrap.log" >&2; exit 1; }
  # The official images' apt sources (with updates and security) are this
  # Debian machine's own; debootstrap wrote only the release itself.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$rootfs/etc/apt/sources.list.d/"
    rm -f "$rootfs/etc/apt/sources.list"
  fi
  # apt as in the official images: no package caches or translations left
  # in a layer after apt-get install (pkgcache.bin and srcpkgcache.bin alone
  # are 80 MB).
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'CONF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CONF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Acquire::GzipIndexes "true";' >"$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/*
  import "$rootfs" docker.io/library/debian:bookworm
  # slim: what apt installs later skips documentation too (the dpkg
  # excludes Debian's slim images carry).
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EXCLUDES'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EXCLUDES
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,info,locale,lintian,linda}/*
  import "$rootfs" docker.io/library/debian:bookworm-slim
  rm -rf "$rootfs"
  log "bases made in $((SECONDS - start)) s"
}

import() { # import ROOTFS REFERENCE
  tar --numeric-owner -C "$1" -c . |
    podman import --quiet --change 'CMD ["bash"]' - "$2" >/dev/null
}

# sha256 of every file the build context holds (the Dockerfile's COPY . .:
# .dockerignore admits only the paths named with '!'), the Dockerfile and
# .dockerignore, and the base images' ids.
source_hash() {
  local paths
  mapfile -t paths < <(sed -n 's#^!\(.*\)#\1#p' .dockerignore)
  {
    git ls-files -z --cached --others --exclude-standard -- "${paths[@]}" Dockerfile .dockerignore |
      sort -z | xargs -0 sha256sum
    podman image inspect --format '{{.Id}}' docker.io/library/debian:bookworm \
      docker.io/library/debian:bookworm-slim
  } | sha256sum | cut -d' ' -f1
}

# podman exits 1 both for a missing image and for a broken setup: check the
# setup first, so that a broken one is not taken for missing bases.
podman info >/dev/null || { echo "build.sh: podman does not work here (above)" >&2; exit 1; }
make_bases
hash=$(source_hash)
if [ "$(podman image inspect --format '{{index .Labels "io.sagapool.source-hash"}}' "$image" 2>/dev/null)" = "$hash" ]; then
  log "$image is up to date"
  echo "$image"
  exit 0
fi

revision=$(git rev-parse HEAD)
[ -z "$(git status --porcelain)" ] || revision+=-dirty
source=${SAGA_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || true)}
# Only a URL others can reach is a source; a clone's local path is not.
[[ $source =~ ^(https?|ssh|git):// || $source =~ ^git@ ]] || source=unknown

log "building $image (podman build, log in ${dir#$root/}/build.log)"
start=$SECONDS
# --isolation chroot and --network host: no user namespaces or network
# plugins needed; --pull=never: the bases above, never a registry.
podman build --isolation chroot --network host --pull=never \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" --build-arg SOURCE="$source" \
  --label io.sagapool.source-hash="$hash" \
  --tag "$image" . >"$dir/build.log" 2>&1 || { tail -30 "$dir/build.log" >&2; exit 1; }
log "built $image in $((SECONDS - start)) s"
# The superseded image and the build stage stay otherwise (vfs stores each
# layer whole).
podman image prune --force >/dev/null
echo "$image"
