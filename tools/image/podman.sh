#!/usr/bin/env bash
# podman on the project's own image storage, for ./dev image, the pod test
# and you:
#   SAGA_IMAGE_DIR=build/image tools/image/podman.sh images
# Storage, state, network settings and the engine settings of
# tools/image/containers.conf stay under SAGA_IMAGE_DIR (podman still leaves
# lock files in its system folders), so a clean clone needs nothing in the
# home folder or in /etc/containers beyond what Debian's podman installs.
# Storage driver: overlay (the kernel's overlayfs; podman as root), or
# SAGA_PODMAN_DRIVER=vfs where overlay mounts are refused (slower: every
# layer and container is a full copy).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${SAGA_IMAGE_DIR:?SAGA_IMAGE_DIR names the folder of the image storage (./dev uses build/image)}
driver=${SAGA_PODMAN_DRIVER:-overlay}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)  # podman keeps these paths: make them absolute
export CONTAINERS_CONF=$here/containers.conf
exec podman --root "$dir/storage-$driver" --runroot "$dir/run-$driver" --tmpdir "$dir/libpod-$driver" \
  --network-config-dir "$dir/networks" --storage-driver "$driver" "$@"
