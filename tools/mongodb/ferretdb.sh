#!/usr/bin/env bash
# FerretDB, a MongoDB wire-compatible server on SQLite, for the mongodb://
# store's tests, the demo and users: one process on a loopback port.
#   ferretdb.sh fetch                        build the pinned FerretDB from the Go
#                                            module proxy (once)
#   ferretdb.sh run [--dir D] [--port P]     start, wait until it answers, print
#                                            the URL, stop it on exit or Ctrl-C
# The binary lives in $SAGA_FERRETDB_HOME (default
# ~/.cache/sagapool/ferretdb-v1.24.2-idx)/ferretdb; the tests find it there
# too (or where SAGA_FERRETDB names it).
#
# One patch (the "-idx" in the folder's name): FerretDB 1.24's SQLite
# handler looks documents up by _id with the expression ->'$._id', while
# its unique _id index is on ->"_id"; SQLite matches index expressions by
# their text, so every lookup, update and delete by _id scanned the whole
# table (EXPLAIN QUERY PLAN: SCAN). The patch makes the lookup's expression
# the index's, as MongoDB's _id lookups are indexed (docs/mongodb.md).
set -euo pipefail
FERRETDB_VERSION=v1.24.2
FERRETDB_BUILD=$FERRETDB_VERSION-idx
FERRETDB_MODULE=github.com/FerretDB/FerretDB

die() { echo "ferretdb.sh: $*" >&2; exit 1; }
home_dir() { echo "${SAGA_FERRETDB_HOME:-$HOME/.cache/sagapool/ferretdb-$FERRETDB_BUILD}"; }

# Go is not on every shell's PATH where it is installed from go.dev's tarball.
find_go() {
  if command -v go >/dev/null; then command -v go
  elif [ -x /usr/local/go/bin/go ]; then echo /usr/local/go/bin/go
  else return 1; fi
}

# --- fetch: idempotent; the marker is written last, so a broken build is redone
cmd_fetch() {
  local home; home="$(home_dir)"
  [ -f "$home/.complete" ] && [ -x "$home/ferretdb" ] && return 0
  local go; go="$(find_go)" || die "Go is needed to build FerretDB $FERRETDB_VERSION (none on PATH nor at /usr/local/go/bin/go; see https://go.dev/doc/install)"
  echo "ferretdb.sh: building FerretDB $FERRETDB_VERSION from the Go module proxy into $home" >&2
  local work="$home.part"
  rm -rf "$work"
  mkdir -p "$work"
  # A private GOPATH and module cache: nothing outside the cache folder is
  # touched, and -modcacherw lets rm remove it afterwards.
  export GOPATH="$work/gopath" GOMODCACHE="$work/gopath/pkg/mod" GOCACHE="$work/gocache"
  export GOFLAGS=-modcacherw GOTOOLCHAIN=local CGO_ENABLED=0
  local src
  # The module is fetched outside any module (go mod download needs none).
  src="$(cd "$work" && "$go" mod download -json "$FERRETDB_MODULE@$FERRETDB_VERSION" 2>"$work/download.log" |
    python3 -c 'import json, sys; print(json.load(sys.stdin).get("Dir", ""))')" || true
  [ -n "$src" ] && [ -d "$src" ] || die "go mod download failed: $(tail -5 "$work/download.log")"
  cp -r "$src" "$work/src"
  chmod -R u+w "$work/src"
  # FerretDB's build embeds its version from this file, and panics without it.
  mkdir -p "$work/src/build/version"
  echo "$FERRETDB_VERSION" >"$work/src/build/version/version.txt"
  local meta="$work/src/internal/backends/sqlite/metadata/metadata.go"
  local lookup="IDColumn = DefaultColumn + \"->'\\$._id'\""  # a regular expression
  grep -q "$lookup" "$meta" || die "the _id index patch no longer applies to $meta"
  sed -i "s/$lookup/IDColumn = DefaultColumn + \`->\"_id\"\`/" "$meta"
  (cd "$work/src" && "$go" build -o "$work/ferretdb" ./cmd/ferretdb) >"$work/build.log" 2>&1 \
    || die "go build failed: $(tail -10 "$work/build.log")"
  "$work/ferretdb" --version >/dev/null 2>&1 || die "the built ferretdb does not run: $("$work/ferretdb" --version 2>&1 | tail -3)"
  # Keep only the binary: the source, the module cache and the build cache
  # are hundreds of megabytes.
  rm -rf "$home"
  mkdir -p "$home"
  mv "$work/ferretdb" "$home/ferretdb"
  rm -rf "$work"
  touch "$home/.complete"
}

# --- run: one FerretDB on 127.0.0.1 in the foreground until a signal
cmd_run() {
  local dir="" port=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --dir) dir="${2:?--dir needs a folder}"; shift 2 ;;
      --port) port="${2:?--port needs a number}"; shift 2 ;;
      *) die "unknown argument '$1' (expected --dir DIR, --port PORT)" ;;
    esac
  done
  [ -z "$port" ] || [[ $port =~ ^[0-9]+$ && $port -gt 0 && $port -lt 65536 ]] || die "--port must be a TCP port number"
  cmd_fetch
  # Something else answering on the port would pass for this server below.
  if [ -n "$port" ]; then
    ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || die "127.0.0.1:$port is in use"
  else
    # A free port below the kernel's ephemeral range (so no client's outgoing
    # connection can take it between this check and FerretDB's bind).
    port="$(python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(10000, low) if low > 11000 else 0))
        print(s.getsockname()[1])
        break
    except OSError:
        pass
    finally:
        s.close()
PY
)"
  fi
  # Globals, not locals: the EXIT trap runs after cmd_run has returned.
  own_dir="" server_pid="" watchdog_pid=""
  if [ -z "$dir" ]; then
    dir="$(mktemp -d -t sagapool-ferretdb.XXXXXX)"
    own_dir="$dir"
  fi
  mkdir -p "$dir/data" "$dir/state"
  stop_server() {  # stop_server STATUS: the status to exit with
    # A second signal (timeout and Ctrl-C signal the whole process group)
    # must not cut the cleanup short.
    trap - EXIT
    trap '' INT TERM
    if [ -n "$server_pid" ]; then
      kill -TERM "$server_pid" 2>/dev/null || true
      for _ in $(seq 1 100); do
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -KILL "$server_pid" 2>/dev/null || true
      wait "$server_pid" 2>/dev/null || true
    fi
    [ -z "$watchdog_pid" ] || kill -KILL "$watchdog_pid" 2>/dev/null || true
    [ -z "$own_dir" ] || rm -rf "$own_dir"
    exit "$1"
  }
  trap 'stop_server $?' EXIT
  trap 'stop_server 0' INT TERM
  local home; home="$(home_dir)"
  "$home/ferretdb" --handler=sqlite --sqlite-url="file:$dir/data/" --state-dir="$dir/state" \
    --listen-addr="127.0.0.1:$port" --debug-addr=- --telemetry=disable --log-level=WARN \
    >"$dir/ferretdb.log" 2>&1 &
  server_pid=$!
  # A watchdog: if this launcher is SIGKILLed (no trap runs), it sees its
  # parent gone and kills the server.
  (
    trap '' TERM INT
    while kill -0 "$server_pid" 2>/dev/null; do
      kill -0 "$$" 2>/dev/null || { kill -KILL "$server_pid"; exit 0; }
      sleep 1
    done
  ) &
  watchdog_pid=$!
  disown "$watchdog_pid"  # killed at the end: no "Killed" report from bash
  local up=0
  for _ in $(seq 1 300); do
    kill -0 "$server_pid" 2>/dev/null || break
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=1; break; fi
    sleep 0.1
  done
  if [ "$up" != 1 ]; then
    tail -20 "$dir/ferretdb.log" >&2
    die "FerretDB did not accept connections on 127.0.0.1:$port within 30 s"
  fi
  echo "mongodb://127.0.0.1:$port/"
  wait "$server_pid" || die "FerretDB exited: $(tail -5 "$dir/ferretdb.log")"
}

cmd="${1:-}"; [ $# -gt 0 ] && shift
case "$cmd" in
  fetch | run) "cmd_$cmd" "$@" ;;
  *) die "usage: ferretdb.sh fetch | run [--dir DIR] [--port PORT]" ;;
esac
