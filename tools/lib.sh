# Shell functions of tools/demo.sh: free loopback ports and throwaway
# PostgreSQL servers (bench/run.py has its own, in Python:
# bench/sagabench/servers.py). Source it after setting
#   WORK          the run's temporary folder (servers live in $WORK/NAME)
#   LIB_NAME      the caller's name, for error messages (demo)
# and declaring the array PG_DIRS=() (the servers started, for pg_stop).
# PG_SERVER_OPTS (set after pg_init_tools) holds the server's -c options;
# pg_init_tools sets PG_STATS to the option loading pg_stat_statements when
# the server package has it.

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The server refuses to run as root: as root it runs as the `postgres` system
# user (Debian's `postgresql` package creates it), else `nobody`. Trust on its
# own unix socket, scram-sha-256 over TCP; the password reaches every client
# (workers, sagactl, psql, pgbench) through a pgpass file, never a flag or a
# log line.
PG_BIN="" PG_USER="" PG_AS=() PG_URL="" PG_STATS="" PG_PORT="" PG_SERVER_OPTS=""
pg_init_tools() {
  PG_BIN=${SAGA_PG_BIN_DIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5n | tail -1)}
  if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/postgres" ]; then
    echo "$LIB_NAME: PostgreSQL server programs not found under /usr/lib/postgresql/<version>/bin" \
         "(install Debian's postgresql package, or set SAGA_PG_BIN_DIR)" >&2
    exit 1
  fi
  if [ "$(id -u)" = 0 ]; then
    PG_USER=postgres
    id -u postgres >/dev/null 2>&1 || PG_USER=nobody
    PG_AS=(runuser -u "$PG_USER" --)
    chmod 711 "$WORK"  # the server's user must reach its folder inside
  fi
  # pg_stat_statements (in Debian's server package) counts the statements,
  # and so the round trips, of every stage.
  [ -f "$(dirname "$PG_BIN")/lib/pg_stat_statements.so" ] && PG_STATS="-c shared_preload_libraries=pg_stat_statements"
  export PGPASSFILE="$WORK/pgpass"
  : >"$PGPASSFILE"
  chmod 600 "$PGPASSFILE"
}
pg_as() { (cd / && "${PG_AS[@]}" "$@"); }
pg_stop() {  # pg_stop DIR: fast shutdown, immediate if that hangs
  [ -f "$1/data/postmaster.pid" ] || return 0
  pg_as "$PG_BIN/pg_ctl" -D "$1/data" -m fast -t 20 -s stop >/dev/null 2>&1 ||
    pg_as "$PG_BIN/pg_ctl" -D "$1/data" -m immediate -t 10 -s stop >/dev/null 2>&1 || true
}
# pg_start NAME: initdb and start a server in $WORK/NAME on a free loopback
# port with the options $PG_SERVER_OPTS and create database `sagapool`; sets
# PG_URL (no password in it) and PG_PORT.
pg_start() {
  local dir="$WORK/$1" password port attempt
  mkdir -p "$dir/data" "$dir/socket"
  chmod 700 "$dir/data" "$dir/socket"
  password=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  (umask 077; echo "$password" >"$dir/pwfile")
  [ -n "$PG_USER" ] && chown -R "$PG_USER:" "$dir"
  if ! pg_as "$PG_BIN/initdb" -D "$dir/data" -U saga --pwfile="$dir/pwfile" --auth-local=trust \
       --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1; then
    echo "$LIB_NAME: initdb failed:" >&2; tail -20 "$dir/initdb.log" >&2; exit 1
  fi
  rm -f "$dir/pwfile"
  PG_DIRS+=("$dir")
  # A port free a moment ago can be taken when the server binds it: try a few.
  for attempt in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 30000))
    port_free "$port" || continue
    if pg_as "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -s start \
         -o "-h 127.0.0.1 -p $port -k $dir/socket $PG_SERVER_OPTS" \
         >>"$dir/pg_ctl.log" 2>&1; then
      echo "127.0.0.1:$port:*:saga:$password" >>"$PGPASSFILE"
      PG_URL="postgresql://saga@127.0.0.1:$port/sagapool"
      PG_PORT=$port
      if ! "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U saga sagapool >>"$dir/pg_ctl.log" 2>&1 ||
         { [ -n "$PG_STATS" ] && ! "$PG_BIN/psql" -XqAt -d "$PG_URL" -c "CREATE EXTENSION pg_stat_statements" \
             >>"$dir/pg_ctl.log" 2>&1; }; then
        echo "$LIB_NAME: creating the database failed:" >&2; tail -5 "$dir/pg_ctl.log" >&2; exit 1
      fi
      return 0
    fi
  done
  echo "$LIB_NAME: the PostgreSQL server in $dir did not start:" >&2
  tail -20 "$dir/server.log" "$dir/pg_ctl.log" >&2 2>/dev/null || true
  exit 1
}
