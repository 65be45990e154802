#!/usr/bin/env bash
# producer_package: `cmake --install` the build into a fresh prefix, then
# build tests/outside_project against it the two ways upstream code would,
# find_package(sagapool CONFIG) and pkg-config sagapool-producer, and run
# the program each time. Fails when the install holds more than the producer
# library, when anything of the rest of the core (SQLite, libpq,
# prometheus-cpp, spdlog) reaches the caller's compile or link line, or
# when the program's checks or its output differ.
#   producer_package_test.sh BUILD_DIR OUTSIDE_PROJECT_DIR CMAKE CXX PKG_CONFIG
set -euo pipefail
build=$1 project=$2 cmake=$3 cxx=$4 pkg_config=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }
# What upstream code must never be made to see or link.
core='sqlite|libpq|-lpq\b|postgresql|prometheus|spdlog|fmt'

# The libraries as they are now (a no-op when up to date), then the install.
"$cmake" --build "$build" --target sagapool_producer sagapool_request sagapool_kafka_base >/dev/null
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
libdir=${libdir:-lib}

# 1. The install holds the producer library and nothing else of the project.
(cd "$prefix" && find . -type f | sed 's|^\./||; s|sagapoolTargets-[a-z]*\.cmake$|sagapoolTargets-CONFIG.cmake|' |
  sort) >"$work/installed"
sort >"$work/wanted" <<LIST
include/sagapool/generator.hpp
include/sagapool/json_text.hpp
include/sagapool/kafka_base.hpp
include/sagapool/producer.hpp
include/sagapool/request.hpp
include/sagapool/status.hpp
include/sagapool/transfer_request.hpp
$libdir/cmake/sagapool/sagapoolConfig.cmake
$libdir/cmake/sagapool/sagapoolConfigVersion.cmake
$libdir/cmake/sagapool/sagapoolTargets-CONFIG.cmake
$libdir/cmake/sagapool/sagapoolTargets.cmake
$libdir/libsagapool_kafka_base.a
$libdir/libsagapool_producer.a
$libdir/libsagapool_request.a
$libdir/pkgconfig/sagapool-producer.pc
LIST
diff -u "$work/wanted" "$work/installed" || fail "the install is not exactly the producer library (above: - wanted, + installed)"

# 2. The exported targets link only each other and librdkafka. (An empty
# $<LINK_ONLY:> is what is left of the build-only warnings target.)
links=$(sed -n 's/.*INTERFACE_LINK_LIBRARIES "\(.*\)"/\1/p' "$prefix/$libdir/cmake/sagapool/sagapoolTargets.cmake" |
  tr ';' '\n' | sed 's/^\\\?\$<LINK_ONLY:\(.*\)>$/\1/' | grep -v '^$' | sort -u | tr '\n' ' ')
[ "$links" = "PkgConfig::RDKAFKA_C sagapool::kafka_base sagapool::request " ] ||
  fail "exported link interface is '$links', want only sagapool::request, sagapool::kafka_base and PkgConfig::RDKAFKA_C"

run_and_compare() { # run_and_compare PROGRAM HOW
  "$1" >"$work/out" || fail "$2: the program's checks failed"
  diff -u "$project/expected_output.txt" "$work/out" || fail "$2: output differs from expected_output.txt"
  if ldd "$1" | grep -Ei "$core"; then fail "$2: the program loads a library of the core (above)"; fi
  echo "ok: $2"
}

# 3. find_package(sagapool CONFIG), with nothing but the prefix to find it in.
"$cmake" -S "$project" -B "$work/with-cmake" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "find_package: configure"; }
"$cmake" --build "$work/with-cmake" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; fail "find_package: build"; }
lines=$(cat "$work/with-cmake/CMakeFiles/publish_one.dir/flags.make" "$work/with-cmake/CMakeFiles/publish_one.dir/link.txt")
if grep -Ei "$core" <<<"$lines"; then fail "find_package: the core reaches the compile or link line (above)"; fi
grep -q "$prefix/$libdir/libsagapool_producer.a" <<<"$lines" || fail "find_package: not linked with the installed library"
grep -q "rdkafka" <<<"$lines" || fail "find_package: librdkafka is not on the link line"
run_and_compare "$work/with-cmake/publish_one" "find_package(sagapool CONFIG)"

# 4. pkg-config --cflags --libs sagapool-producer, found in the prefix only.
flags=$(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" "$pkg_config" --cflags --libs sagapool-producer) ||
  fail "pkg-config does not find sagapool-producer in the prefix"
if grep -Ei "$core" <<<"$flags"; then fail "pkg-config: the core reaches the flags: $flags"; fi
grep -q -- "-lrdkafka" <<<"$flags" || fail "pkg-config: no -lrdkafka in: $flags"
# shellcheck disable=SC2086 # the flags are words
"$cxx" -std=c++17 -o "$work/publish_one" "$project/main.cpp" $flags || fail "pkg-config: build with: $flags"
run_and_compare "$work/publish_one" "pkg-config sagapool-producer ($flags)"
