#!/usr/bin/env bash
# Builds saga-worker and sagactl of the previous release (the commit in
# tests/upgrade/previous-release) from the repository the tests run in, into
# OUT/bin, once: a later run finds OUT/stamp naming the same commit and
# stops. The upgrade test runs these binaries as the "old" build.
#   build_previous.sh SOURCE_DIR OUT_DIR
set -euo pipefail
src=$1
out=$2
commit=$(grep -v '^#' "$src/tests/upgrade/previous-release" | head -n 1 | tr -d '[:space:]')

if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$commit" && -x "$out/bin/saga-worker" && -x "$out/bin/sagactl" ]]; then
  echo "previous release $commit: already built in $out"
  exit 0
fi
if ! git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "FAIL: the previous release $commit is not in the repository at $src;" \
       "the upgrade test needs the project's history (a full git clone, not a shallow one or an archive)" >&2
  exit 1
fi

start=$(date +%s)
rm -rf "$out/src" "$out/build" "$out/bin" "$out/stamp"
mkdir -p "$out/src" "$out/bin"
git -C "$src" archive "$commit" | tar -x -C "$out/src"
cmake -S "$out/src" -B "$out/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF > "$out/configure.log"
cmake --build "$out/build" -j2 --target saga-worker sagactl > "$out/build.log"
cp "$out/build/bin/saga-worker" "$out/build/bin/sagactl" "$out/bin/"
rm -rf "$out/src" "$out/build"  # only the two programs are kept
echo "$commit" > "$out/stamp"
echo "previous release $commit: built saga-worker and sagactl in $(( $(date +%s) - start ))s"
