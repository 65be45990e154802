#!/usr/bin/env bash
# Side-by-side benchmarks (issue #7), in one run on one throwaway PostgreSQL
# server (loopback, default durability: fsync, synchronous_commit and
# full_page_writes on) and this machine, over 100,000 accounts, with uniform
# and Zipf-skewed (s = 1.1) account choice:
#   (a) plain ACID transfer (BEGIN; UPDATE; UPDATE; COMMIT), pgbench
#   (b) the two-phase-commit recipe done naively: 8 autocommitted writes
#       per transfer, one transfer at a time per client, pgbench
#   (c) sagapool end to end on that PostgreSQL: producer -> saga-broker ->
#       saga-worker pool -> PostgreSQL
#   (d) sagapool end to end on SQLite
#   (e) sagapool with 1, 2 and 4 workers (on SQLite unless --scale-store postgres)
#   and a latency run of (c) and (d) at half their measured throughput.
# (c) and (d) run on saga-broker (librdkafka's mock cluster) and again on a
# real one-node Apache Kafka (tools/kafka/kafka.sh), side by side.
# pgbench runs at its best client count (probed first). Every sagapool run
# ends with `sagactl audit`, and the bench fails if it does not pass.
# Writes bench/REPORT.md (the part above its hand-written marker) and
# bench/throughput.png, or into --out DIR; --quick (small sizes, one
# repetition) writes into a temporary folder unless --out is given.
# Each sagapool run moves N transfers: --transfers N, else as many as a short
# calibration run says the store finishes in about 15 s (20,000..150,000).
# The bench keeps to a budget of 13 minutes (SAGA_BENCH_BUDGET_S=780): once a
# phase is past its share, its remaining repetitions are skipped, and the
# report says so.
# Usage: bench/run.sh BIN_DIR [--quick] [--reps N] [--transfers N] [--workers N]
#                     [--clients "1 2 4 ..."] [--scale-store sqlite|postgres]
#                     [--out DIR] [--keep]
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
BIN=$(cd "$1" && pwd); shift
BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH")

ACCOUNTS=100000
BALANCE=1000000000000  # per account: no run can overdraw one, even under Zipf
QUICK=0 REPS=3 TRANSFERS="" WORKERS=2 SCALE_STORE=sqlite OUT="" KEEP=0
CLIENTS="2 4 8 16 32 64"
PROBE_S=2 PGBENCH_S=8 HALF_S=20  # seconds: client-count probes, measured runs, half-load runs
WARMUP_N=2000  # per sagapool run, before the measured transfers
STEADY_AFTER_MS=2000  # steady-state latency leaves out the requests of a run's first 2 s
RUN_S=15 CALIBRATE_N=10000 TRANSFERS_MIN=20000 TRANSFERS_MAX=150000  # sagapool run sizes
# Seconds the bench may take (the build comes on top): repetitions after the
# first are skipped, and the report says so, once a phase is past its share.
BUDGET_S=${SAGA_BENCH_BUDGET_S:-780}
PARTITIONS=12
ARGS=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift ;;
    --reps) REPS=$2; shift 2 ;;
    --transfers) TRANSFERS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --scale-store) SCALE_STORE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "bench: unknown option $1" >&2; exit 2 ;;
  esac
done
if [ "$QUICK" = 1 ]; then  # explicit flags still win
  [[ " ${ARGS[*]} " == *" --reps "* ]] || REPS=1
  [[ " ${ARGS[*]} " == *" --transfers "* ]] || TRANSFERS=5000
  [[ " ${ARGS[*]} " == *" --clients "* ]] || CLIENTS="4 16"
  PROBE_S=1 PGBENCH_S=2 HALF_S=4 WARMUP_N=1000 BUDGET_S=${SAGA_BENCH_BUDGET_S:-300}
fi
case "$SCALE_STORE" in sqlite|postgres) ;; *) echo "bench: --scale-store takes sqlite or postgres" >&2; exit 2 ;; esac
for v in REPS WORKERS ${TRANSFERS:+TRANSFERS}; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "bench: --${v,,} takes a positive integer" >&2; exit 2; }
done
for tool in sqlite3 curl awk; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is needed (./dev installs it)" >&2; exit 1; }
done

WORK=$(mktemp -d -t sagapool-bench-XXXXXX)
PIDS=()     # every process started and still running (servers excepted)
PG_DIRS=()
cleanup() {
  local rc=$? pid left
  # SIGTERM, up to 30 s to drain (a worker whose broker is gone may never
  # finish leaving its group), then SIGKILL.
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for _ in $(seq 60); do
    left=0; for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break; sleep 0.5
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for dir in "${PG_DIRS[@]}"; do pg_stop "$dir"; done
  # Kept for a look when asked, or when the bench failed (not when interrupted).
  if [ "$KEEP" = 1 ] || { [ "$rc" != 0 ] && [ "$rc" != 130 ] && [ "$rc" != 143 ]; }; then
    echo "bench files kept in $WORK" >&2
  else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
LIB_NAME=bench
# shellcheck source=tools/lib.sh
. "$ROOT/tools/lib.sh"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
note() { printf '    %s\n' "$*" >&2; }
die() { printf '\033[1;31mbench: %s\033[0m\n' "$*" >&2; exit 1; }
BENCH_START=$(date +%s)
LOAD_AT_START=$(cut -d' ' -f1-3 /proc/loadavg)
elapsed() { echo "$(( $(date +%s) - BENCH_START )) s"; }
TCK=$(getconf CLK_TCK)

# ---- CPU and memory, from /proc --------------------------------------------
# user + system ticks of a process and of its children already reaped.
proc_ticks() {
  { cat "/proc/$1/stat" 2>/dev/null || true; } | awk '{ sub(/^.*\) /, ""); s = $12 + $13 + $14 + $15 } END { print s + 0 }'
}
# The same over a process and its live children: the PostgreSQL server is
# the postmaster, whose children (backends, checkpointer, WAL writer,
# autovacuum) add their times to it when they exit.
tree_ticks() {  # (cat, not awk, opens the files: a process may exit meanwhile)
  { cat /proc/[0-9]*/stat 2>/dev/null || true; } |
    awk -v root="$1" '{ pid = $1; sub(/^.*\) /, "")
                        if (pid == root || $2 == root) s += $12 + $13 + $14 + $15 }
                      END { printf "%d\n", s }'
}
vm_hwm_kb() { { cat "/proc/$1/status" 2>/dev/null || true; } | awk '/^VmHWM:/ { v = $2 } END { print v + 0 }'; }
pg_ticks() { tree_ticks "$(head -1 "$PG_DATA/postmaster.pid")"; }

median() {  # median of the numbers on stdin (the lower middle of an even count)
  sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "NaN" }'
}

# ---- the PostgreSQL server --------------------------------------------------
say "starting a throwaway PostgreSQL server (default durability)"
pg_init_tools
PG_STATS=""  # no pg_stat_statements: measure the server as deployed
PG_SERVER_OPTS="-c max_connections=200"
pg_start pg
PG_DATA=$WORK/pg/data
PG_ADMIN_URL=$PG_URL  # database `sagapool`: the baselines' tables, and where CREATE DATABASE runs
pg_url() { echo "postgresql://saga@127.0.0.1:$PG_PORT/$1"; }
psql_q() { "$PG_BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }
PG_VERSION=$("$PG_BIN/postgres" --version | sed 's/^postgres (PostgreSQL) //')
PG_SETTINGS=$(psql_q "$PG_ADMIN_URL" "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
  FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method',
  'shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'wal_level')")
note "PostgreSQL $PG_VERSION: $PG_SETTINGS"
for s in fsync synchronous_commit full_page_writes; do
  [ "$(psql_q "$PG_ADMIN_URL" "SHOW $s")" = on ] || die "PostgreSQL $s is not on: durability weakened"
done

# How fast this disk makes a small write durable: every commit waits for one.
DSYNC_RATE=$(LC_ALL=C dd if=/dev/zero of="$WORK/dsync-test" bs=8k count=300 oflag=dsync 2>&1 |
  awk '/copied/ { for (i = 1; i < NF; i++) if ($(i + 1) ~ /^s,?$/) t = $i } END { if (t > 0) printf "%.0f", 300 / t; else print "?" }')
rm -f "$WORK/dsync-test"
note "disk: $DSYNC_RATE synchronous 8 kB writes/s"

# ---- the ledgers: accounts acct-0 .. acct-99999 -------------------------------
say "creating the ledgers: $ACCOUNTS accounts ($(elapsed))"
{ echo "id,balance"; awk -v n="$ACCOUNTS" -v b="$BALANCE" 'BEGIN { for (i = 0; i < n; i++) printf "acct-%d,%s\n", i, b }'; } \
  >"$WORK/accounts.csv"
psql_q "$PG_ADMIN_URL" "CREATE DATABASE saga_template" >/dev/null
"$BIN/sagactl" --store "$(pg_url saga_template)" init >/dev/null
# The PostgreSQL import (one durable commit per chunk) runs while the rest is built.
"$BIN/sagactl" --store "$(pg_url saga_template)" accounts import "$WORK/accounts.csv" >"$WORK/import-pg.out" 2>&1 &
IMPORT_PID=$!; PIDS+=("$IMPORT_PID")
"$BIN/sagactl" --store "sqlite:$WORK/template.db" init >/dev/null
"$BIN/sagactl" --store "sqlite:$WORK/template.db" accounts import "$WORK/accounts.csv" >/dev/null
sqlite3 "$WORK/template.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -v naccounts="$ACCOUNTS" -v balance="$BALANCE" \
  -d "$PG_ADMIN_URL" -f "$BENCH/tables.sql" 2>&1 | grep -v 'NOTICE: .* does not exist, skipping' || true
[ "$(psql_q "$PG_ADMIN_URL" "SELECT count(*) FROM plain_accounts")" = "$ACCOUNTS" ] || die "the baselines' tables were not created"
wait "$IMPORT_PID" || { cat "$WORK/import-pg.out" >&2; die "sagactl accounts import failed on PostgreSQL"; }
PIDS=()

# Uniform requests come from a file (saga-producer's generator is always
# Zipf-skewed); every line is valid: distinct accounts, amount 1..10000.
uniform_file() {  # uniform_file N: path of a JSON-lines file of N uniform requests
  local f="$WORK/uniform-$1.jsonl"
  [ -s "$f" ] || awk -v n="$1" -v m="$ACCOUNTS" 'BEGIN {
      srand(7)
      for (i = 0; i < n; i++) {
        a = int(rand() * m); b = int(rand() * (m - 1)); if (b >= a) b++
        printf "{\"id\": \"u-%d\", \"from\": \"acct-%d\", \"to\": \"acct-%d\", \"amount\": %d}\n", i, a, b, 1 + int(rand() * 10000)
      }
    }' >"$f"
  echo "$f"
}

# Results, one line per measured run:
#   config rep transfers_per_s p50_ms p99_ms cpu_s_per_1k rss_kb steady_p50_ms steady_p99_ms
# ("-" where a figure does not apply)
RESULTS=$WORK/results.tsv
: >"$RESULTS"
record() { printf '%s\n' "$*" >>"$RESULTS"; }

# ---- (a), (b): pgbench ----------------------------------------------------------
PGB_SEQ=0
# pgb SCRIPT ZIPF CLIENTS SECONDS [log]: runs pgbench; sets PGB to
# (tps transactions cpu_ticks p50_ms p99_ms) (latencies only with `log`).
PGB=()
pgb() {
  local script=$1 zipf=$2 clients=$3 secs=$4 log=${5:-} dir t0 t1 jobs tps n client_ticks lat=(NaN NaN) opts=()
  PGB_SEQ=$((PGB_SEQ + 1)); dir="$WORK/pgbench-$PGB_SEQ"; mkdir -p "$dir"
  jobs=$(( clients < $(nproc) ? clients : $(nproc) ))
  [ -n "$log" ] && opts=(-l --log-prefix "$dir/tx")
  "$PG_BIN/psql" -XqAt -v ON_ERROR_STOP=1 -d "$PG_ADMIN_URL" -c "VACUUM plain_accounts" -c "VACUUM tpc_accounts" \
    -c "CHECKPOINT" >/dev/null
  t0=$(pg_ticks)
  # `times` in the subshell: the user and system time of its child, pgbench.
  ( "$PG_BIN/pgbench" -n -M prepared -c "$clients" -j "$jobs" -T "$secs" -D zipf="$zipf" \
      -D naccounts="$ACCOUNTS" "${opts[@]}" -f "$BENCH/$script" "$PG_ADMIN_URL" >"$dir/out" 2>&1
    echo $? >"$dir/rc"; times >"$dir/times" )
  t1=$(pg_ticks)
  [ "$(cat "$dir/rc")" = 0 ] || { tail -20 "$dir/out" >&2; die "pgbench $script failed (clients $clients)"; }
  tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$dir/out")
  n=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$dir/out")
  [ -n "$tps" ] && [ "${n:-0}" -gt 0 ] || { cat "$dir/out" >&2; die "pgbench $script: no result"; }
  client_ticks=$(awk -v tck="$TCK" 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); s += p[1] * 60 + p[2] } }
                                    END { printf "%d", s * tck }' "$dir/times")
  if [ -n "$log" ]; then  # third column: the transaction's latency in microseconds
    read -r -a lat < <(cat "$dir"/tx.* | awk '{ print $3 }' | sort -n |
      awk '{ v[NR] = $1 } END { printf "%.1f %.1f\n", v[int(NR * 0.5) + 1] / 1000, v[int(NR * 0.99) + 1] / 1000 }')
    rm -f "$dir"/tx.*
  fi
  PGB=("$tps" "$n" "$((t1 - t0 + client_ticks))" "${lat[0]}" "${lat[1]}")
}
# pgbench_config LABEL SCRIPT ZIPF: probe the client counts, then REPS runs at the best.
declare -A BEST_CLIENTS
pgbench_config() {
  local label=$1 script=$2 zipf=$3 c r tps best=0 best_c=1 fields
  for c in $CLIENTS; do
    pgb "$script" "$zipf" "$c" "$PROBE_S"
    tps=${PGB[0]}
    note "$label: $c client(s): $(printf '%.0f' "$tps") transfers/s"
    if awk -v a="$tps" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$tps; best_c=$c
    elif awk -v a="$tps" -v b="$best" 'BEGIN { exit !(a < 0.9 * b) }'; then break; fi  # past the peak
  done
  BEST_CLIENTS[$label]=$best_c
  for r in $(seq "$REPS"); do
    pgb "$script" "$zipf" "$best_c" "$PGBENCH_S" log
    fields=("${PGB[@]}")
    record "$label $r $(printf '%.0f' "${fields[0]}") ${fields[3]} ${fields[4]} $(awk -v t="${fields[2]}" -v n="${fields[1]}" -v tck="$TCK" \
      'BEGIN { printf "%.3f", t / tck / n * 1000 }') - - -"
    note "$label: run $r at $best_c clients: $(printf '%.0f' "${fields[0]}") transfers/s, p50 ${fields[3]} ms, p99 ${fields[4]} ms"
  done
}
say "(a) plain ACID transfers and (b) the naive two-phase-commit recipe, pgbench ($(elapsed))"
pgbench_config a-uniform plain_transfer.sql 0
pgbench_config a-zipf plain_transfer.sql 1
pgbench_config b-uniform tpc_transfer.sql 0
pgbench_config b-zipf tpc_transfer.sql 1
# The baselines' own audit: money conserved, nothing left half-done.
BASE_AUDIT=$(psql_q "$PG_ADMIN_URL" "SELECT
  (SELECT sum(balance) FROM plain_accounts) = $ACCOUNTS::numeric * $BALANCE
  AND (SELECT sum(balance) FROM tpc_accounts) = $ACCOUNTS::numeric * $BALANCE
  AND NOT EXISTS (SELECT 1 FROM tpc_accounts WHERE pending <> '{}')
  AND NOT EXISTS (SELECT 1 FROM tpc_transfers WHERE state <> 'done')")
[ "$BASE_AUDIT" = t ] || die "the baselines' ledgers do not balance after pgbench"
note "baselines audited: balances conserved, no pending entry or unfinished transfer left"

# ---- (c), (d), (e): sagapool end to end -----------------------------------------------
RUN_SEQ=0
RUN_PIDS=()
# free_port USED...: a free loopback port for a worker's /metrics, below
# Linux's ephemeral range (32768 and up: client sockets take those) and
# not one of USED.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 12000))
    [[ " $* " == *" $p "* ]] && continue
    port_free "$p" && { echo "$p"; return; }
  done
  die "no free port found"
}
stop_run_pids() {
  local pid
  for pid in "${RUN_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${RUN_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  RUN_PIDS=()
}
forget_pids() {  # drop from PIDS the given pids (they were waited for)
  local keep=() p q drop
  for p in "${PIDS[@]}"; do drop=0; for q; do [ "$p" = "$q" ] && drop=1; done; [ $drop = 1 ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}
# wait_outcomes COUNT WHAT: until the store holds COUNT transfers, every one
# terminal and published (uses saga_run's sql, T, OPEN, pids, run).
wait_outcomes() {
  local want=$1 what=$2 deadline seen open i
  deadline=$(( $(date +%s) + 60 + want / 200 ))
  while :; do
    seen=$(sql "SELECT count(*) FROM $T" 2>/dev/null || echo 0)
    open=$(sql "SELECT count(*) FROM $T WHERE $OPEN" 2>/dev/null || echo "?")
    [ "${seen:-0}" -ge "$want" ] && [ "$open" = 0 ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || die "$what: timed out waiting for outcomes ($seen of $want ingested, $open unfinished)"
    for i in "${pids[@]}"; do kill -0 "$i" 2>/dev/null || { tail "$run"/worker-*.log >&2; die "$what: a worker died"; }; done
    sleep 0.25
  done
}
# The bench's real Kafka: one KRaft node (replication 1: one machine), the
# three topics with PARTITIONS partitions; started once, on first use.
KAFKA_PID="" KAFKA_BOOTSTRAP=""
start_kafka() {
  [ -n "$KAFKA_PID" ] && return 0
  local k="$WORK/kafka"
  "$ROOT/tools/kafka/kafka.sh" configure --brokers 1 --dir "$k" >"$WORK/kafka-configure.log" 2>&1 ||
    { cat "$WORK/kafka-configure.log" >&2; die "tools/kafka/kafka.sh configure failed"; }
  KAFKA_BOOTSTRAP=$(cat "$k/bootstrap")
  "$ROOT/tools/kafka/kafka.sh" node --dir "$k" --node 1 >"$k/node-1.log" 2>&1 &
  KAFKA_PID=$!; PIDS+=("$KAFKA_PID")
  for _ in $(seq 120); do kcat -b "$KAFKA_BOOTSTRAP" -L -m 2 >/dev/null 2>&1 && break; sleep 0.5; done
  "$ROOT/tools/kafka/kafka.sh" topics --bootstrap "$KAFKA_BOOTSTRAP" --partitions "$PARTITIONS" --replication 1 \
    transfers.requests transfers.results transfers.dlq >&2 || { tail "$k/node-1.log" >&2; die "Kafka did not start"; }
}
# saga_run CONFIG REP STORE(postgres|sqlite) DIST(uniform|zipf) WORKERS N [RATE] [BROKER(mock|kafka)]:
# a fresh ledger and worker pool, and a fresh saga-broker (or the bench's
# Kafka node, whose group resumes after the last run's requests); N
# requests; waits until every one is terminal and published; records the
# figures; drains the workers; audits.
saga_run() {
  local config=$1 rep=$2 store=$3 dist=$4 workers=$5 n=$6 rate=${7:-0} broker=${8:-mock}
  local run db="" stores=() sql broker_pid pids=() ports=() i t0 t1 seen
  local worker_ticks=0 rss_max=0 span p50 p99 done_n tput cpu broker_ticks pg_delta=0
  RUN_SEQ=$((RUN_SEQ + 1)); run="$WORK/run-$RUN_SEQ"; mkdir -p "$run"
  if [ "$store" = postgres ]; then
    db="saga_run_$RUN_SEQ"
    psql_q "$PG_ADMIN_URL" "CREATE DATABASE $db TEMPLATE saga_template" >/dev/null
    stores=(--store "$(pg_url "$db")")
    sql() { psql_q "$(pg_url "$db")" "$1"; }
    T=saga_transfers REQ=requested_at_ms FIN=finished_at_ms OPEN="state NOT IN ('done', 'canceled') OR NOT notified"
  else
    cp "$WORK/template.db" "$run/ledger.db"
    stores=(--store "sqlite:$run/ledger.db")
    sql() { sqlite3 "$run/ledger.db" "$1"; }
    T=transfers REQ=requested_at FIN=finished_at OPEN="state NOT IN ('done', 'canceled') OR notified = 0"
  fi
  local brokers
  if [ "$broker" = kafka ]; then
    start_kafka
    broker_pid=$KAFKA_PID brokers=$KAFKA_BOOTSTRAP
  else
    "$BIN/saga-broker" --partitions "$PARTITIONS" --bootstrap-file "$run/bootstrap" >"$run/broker.log" 2>&1 &
    broker_pid=$!; PIDS+=("$broker_pid"); RUN_PIDS+=("$broker_pid")
    for _ in $(seq 100); do [ -s "$run/bootstrap" ] && break; sleep 0.1; done
    [ -s "$run/bootstrap" ] || { tail "$run/broker.log" >&2; die "saga-broker did not start"; }
    brokers=$(cat "$run/bootstrap")
  fi
  for i in $(seq 0 $((workers - 1))); do
    ports+=("$(free_port "${ports[@]}")")
    "$BIN/saga-worker" --brokers "$brokers" --group bench "${stores[@]}" --worker-id "bench-$i" \
      --metrics-addr "127.0.0.1:${ports[$i]}" --lease 10s >"$run/worker-$i.log" 2>&1 &
    pids+=($!); PIDS+=($!); RUN_PIDS+=($!)
  done
  # Publish once the group has settled (every partition assigned), so it
  # does not rebalance while the burst arrives.
  for _ in $(seq 150); do
    local assigned=0 f last
    for f in "$run"/worker-*.log; do
      last=$(grep -o '[0-9]* assigned now' "$f" 2>/dev/null | tail -1 | cut -d' ' -f1 || true)
      assigned=$((assigned + ${last:-0}))
    done
    [ "$assigned" = "$PARTITIONS" ] && break
    for i in "${pids[@]}"; do kill -0 "$i" 2>/dev/null || { tail "$run"/worker-*.log >&2; die "a worker exited at start"; }; done
    sleep 0.2
  done
  [ "$assigned" = "$PARTITIONS" ] || note "warning: the group had $assigned of $PARTITIONS partitions assigned after 30 s"
  # Warm-up: WARMUP_N transfers (ids warm-*) through the whole pipeline
  # first, so the figures leave out cold start (first fetches, cold caches);
  # they are not counted, but audited with the rest.
  "$BIN/saga-producer" --brokers "$brokers" --generate "$WARMUP_N" --accounts "$ACCOUNTS" --seed 999 \
    --id-prefix warm --invalid-ratio 0 --overdraw-ratio 0 --unknown-ratio 0 >"$run/warmup.out" 2>&1 ||
    { cat "$run/warmup.out" >&2; die "saga-producer failed (warm-up)"; }
  wait_outcomes "$WARMUP_N" "$config warm-up"
  for i in "${pids[@]}"; do worker_ticks=$((worker_ticks - $(proc_ticks "$i"))); done
  broker_ticks=$((-$(proc_ticks "$broker_pid")))
  [ "$store" = postgres ] && t0=$(pg_ticks)
  local producer=("$BIN/saga-producer" --brokers "$brokers")
  if [ "$dist" = uniform ]; then producer+=(--file "$(uniform_file "$n")")
  else producer+=(--generate "$n" --accounts "$ACCOUNTS" --seed "$RUN_SEQ" --invalid-ratio 0 --overdraw-ratio 0 --unknown-ratio 0)
  fi
  [ "$rate" != 0 ] && producer+=(--rate "$rate")
  "${producer[@]}" >"$run/producer.out" 2>&1 || { cat "$run/producer.out" >&2; die "saga-producer failed"; }
  wait_outcomes $((WARMUP_N + n)) "$config"
  [ "$store" = postgres ] && { t1=$(pg_ticks); pg_delta=$((t1 - t0)); }
  for i in "${pids[@]}"; do
    worker_ticks=$((worker_ticks + $(proc_ticks "$i")))
    local hwm; hwm=$(vm_hwm_kb "$i"); [ "${hwm:-0}" -gt "$rss_max" ] && rss_max=$hwm
  done
  broker_ticks=$((broker_ticks + $(proc_ticks "$broker_pid")))
  local m="id NOT LIKE 'warm-%'"  # the measured transfers
  seen=$(sql "SELECT count(*) FROM $T WHERE $m")
  span=$(sql "SELECT max($FIN) - min($REQ) FROM $T WHERE $m")
  done_n=$(sql "SELECT count(*) FROM $T WHERE $m AND state = 'done'")
  p50=$(sql "SELECT $FIN - $REQ AS ms FROM $T WHERE $m ORDER BY ms LIMIT 1 OFFSET $((seen * 50 / 100))")
  p99=$(sql "SELECT $FIN - $REQ AS ms FROM $T WHERE $m ORDER BY ms LIMIT 1 OFFSET $((seen * 99 / 100))")
  # Steady state: without the first STEADY_AFTER_MS of requests. A fresh
  # saga-producer stamps its first messages before its idempotent producer
  # has connected, so they wait up to a second in its queue.
  local s0 ns s50 s99
  s0=$(sql "SELECT min($REQ) + $STEADY_AFTER_MS FROM $T WHERE $m")
  ns=$(sql "SELECT count(*) FROM $T WHERE $m AND $REQ >= $s0")
  s50=- s99=-
  if [ "${ns:-0}" -gt 0 ]; then
    s50=$(sql "SELECT $FIN - $REQ AS ms FROM $T WHERE $m AND $REQ >= $s0 ORDER BY ms LIMIT 1 OFFSET $((ns * 50 / 100))")
    s99=$(sql "SELECT $FIN - $REQ AS ms FROM $T WHERE $m AND $REQ >= $s0 ORDER BY ms LIMIT 1 OFFSET $((ns * 99 / 100))")
  fi
  [ "$done_n" = "$n" ] || note "warning: $config: $done_n of $n transfers done (the rest canceled)"
  # Drain: SIGTERM, and each worker must exit 0.
  for i in "${pids[@]}"; do kill -TERM "$i" 2>/dev/null || true; done
  for i in "${pids[@]}"; do wait "$i" || die "$config: a worker did not exit cleanly (logs: run-$RUN_SEQ)"; done
  forget_pids "${pids[@]}"
  RUN_PIDS=()  # the workers were waited for: their pids may be reused
  if [ "$broker" = mock ]; then
    RUN_PIDS=("$broker_pid")
    stop_run_pids
    forget_pids "$broker_pid"
  fi
  if ! "$BIN/sagactl" "${stores[@]}" audit >"$run/audit.out" 2>&1; then
    cat "$run/audit.out" >&2
    die "$config run $rep: sagactl audit FAILED"
  fi
  tput=$(awk -v n="$seen" -v ms="$span" 'BEGIN { printf "%.0f", n * 1000 / (ms > 0 ? ms : 1) }')
  cpu=$(awk -v t=$((worker_ticks + broker_ticks + pg_delta)) -v n="$seen" -v tck="$TCK" 'BEGIN { printf "%.3f", t / tck / n * 1000 }')
  record "$config $rep $tput $p50 $p99 $cpu $rss_max $s50 $s99"
  note "$config run $rep: $n transfers, $tput transfers/s, p50 $p50 ms, p99 $p99 ms (after the first $((STEADY_AFTER_MS / 1000)) s: $s50 / $s99 ms), $cpu CPU s/1k, worker peak RSS $((rss_max / 1024)) MiB; audit passed"
  if [ "$store" = postgres ]; then psql_q "$PG_ADMIN_URL" "DROP DATABASE $db" >/dev/null
  else rm -f "$run"/ledger.db*; fi
}

# Run sizes: --transfers N, else what each store finishes in about RUN_S
# seconds, measured by a short calibration run (so the bench keeps to its
# time budget however fast the binaries are), within TRANSFERS_MIN..MAX.
declare -A RUN_N
run_size() {  # run_size STORE: sets RUN_N[STORE]
  local tput
  if [ -n "$TRANSFERS" ]; then RUN_N[$1]=$TRANSFERS; return; fi
  saga_run "calibrate-$1" 1 "$1" zipf "$WORKERS" "$CALIBRATE_N"
  tput=$(awk -v c="calibrate-$1" '$1 == c { print $3 }' "$RESULTS")
  RUN_N[$1]=$(awk -v t="$tput" -v s="$RUN_S" -v lo="$TRANSFERS_MIN" -v hi="$TRANSFERS_MAX" \
    'BEGIN { n = int(t * s / 1000) * 1000; print (n < lo ? lo : n > hi ? hi : n) }')
}
# What is left of the budget, shared out: (c) to 40 %, (d) to 65 %, (e) to
# 90 %, the rest for the half-load runs and the report.
SAGA_T0=$(date +%s)
SAGA_LEFT=$(( BENCH_START + BUDGET_S - SAGA_T0 )); [ "$SAGA_LEFT" -gt 0 ] || SAGA_LEFT=0
phase_end() { echo $(( SAGA_T0 + SAGA_LEFT * $1 / 100 )); }
SKIPPED=()
rep_ok() {  # rep_ok REP DEADLINE WHAT: the first run always; later ones while time is left
  [ "$1" = 1 ] && return 0
  [ "$(date +%s)" -lt "$2" ] && return 0
  note "skipping run $1 of $3 and later: past this phase's share of the ${BUDGET_S} s budget"
  SKIPPED+=("$3 from run $1")
  return 1
}
say "(c) sagapool on PostgreSQL, $WORKERS workers ($(elapsed))"
PHASE_END=$(phase_end 40)
run_size postgres
note "${RUN_N[postgres]} transfers per run"
for r in $(seq "$REPS"); do
  rep_ok "$r" "$PHASE_END" "(c)" || break
  saga_run c-uniform "$r" postgres uniform "$WORKERS" "${RUN_N[postgres]}"
  saga_run c-zipf "$r" postgres zipf "$WORKERS" "${RUN_N[postgres]}"
done
say "(d) sagapool on SQLite, $WORKERS workers ($(elapsed))"
PHASE_END=$(phase_end 60)
run_size sqlite
note "${RUN_N[sqlite]} transfers per run"
for r in $(seq "$REPS"); do
  rep_ok "$r" "$PHASE_END" "(d)" || break
  saga_run d-uniform "$r" sqlite uniform "$WORKERS" "${RUN_N[sqlite]}"
  saga_run d-zipf "$r" sqlite zipf "$WORKERS" "${RUN_N[sqlite]}"
done
say "(c) and (d) on a real Kafka node ($(elapsed))"
PHASE_END=$(phase_end 75)
for r in $(seq "$REPS"); do
  rep_ok "$r" "$PHASE_END" "(c), (d) on real Kafka" || break
  for dist in uniform zipf; do
    saga_run "ck-$dist" "$r" postgres "$dist" "$WORKERS" "${RUN_N[postgres]}" 0 kafka
    saga_run "dk-$dist" "$r" sqlite "$dist" "$WORKERS" "${RUN_N[sqlite]}" 0 kafka
  done
done
say "(e) scaling on $SCALE_STORE: 1, 2 and 4 workers, Zipf ($(elapsed))"
PHASE_END=$(phase_end 90)
SCALE_FROM=$([ "$SCALE_STORE" = postgres ] && echo c-zipf || echo d-zipf)
SCALE_NAME=$([ "$SCALE_STORE" = postgres ] && echo PostgreSQL || echo SQLite)
for w in 1 2 4; do
  if [ "$w" = "$WORKERS" ]; then  # measured above
    grep "^$SCALE_FROM " "$RESULTS" | sed "s/^$SCALE_FROM /e-$w /" >>"$RESULTS"
    continue
  fi
  for r in $(seq "$REPS"); do
    rep_ok "$r" "$PHASE_END" "(e) with $w workers" || break
    saga_run "e-$w" "$r" "$SCALE_STORE" zipf "$w" "${RUN_N[$SCALE_STORE]}"
  done
done

col_median() {  # col_median CONFIG COLUMN(3..7)
  awk -v c="$1" -v k="$2" '$1 == c && $k != "-" && $k != "NaN" { print $k }' "$RESULTS" | median
}
say "half-load latency: (c) and (d) at half their measured Zipf throughput, for $HALF_S s ($(elapsed))"
for pair in "c-zipf postgres" "d-zipf sqlite"; do
  set -- $pair
  rate=$(awk -v t="$(col_median "$1" 3)" 'BEGIN { printf "%d", t / 2 }')
  n=$((rate * HALF_S)); [ "$n" -ge 1000 ] || n=1000
  saga_run "half-${1%%-*}" 1 "$2" zipf "$WORKERS" "$n" "$rate"
  echo "${1%%-*} $rate" >>"$WORK/half-rates"
done

# ---- the report ------------------------------------------------------------------
say "writing the report ($(elapsed))"
# A --quick report goes to a folder of its own that outlives the bench's.
OUT=${OUT:-$([ "$QUICK" = 1 ] && mktemp -d -t sagapool-bench-report-XXXXXX || echo "$BENCH")}
mkdir -p "$OUT"
REPORT=$OUT/REPORT.md
MARKER='<!-- Hand-written below this line: bench/run.sh keeps everything after it. -->'
HAND=""
[ -f "$REPORT" ] && HAND=$(awk -v m="$MARKER" 'found { print } $0 == m { found = 1 }' "$REPORT")
[ -n "$HAND" ] || HAND=$(cat <<'EOF'

## Where the time goes

Profile notes (perf, pg_stat_statements, the workers' stage histograms):
what dominates each of (c) and (d), and what would move it.

- (to be filled in)
EOF
)
BENCH_WALL=$(( $(date +%s) - BENCH_START ))
fmt() { awk -v v="$1" -v d="${2:-0}" 'BEGIN { if (v == "NaN" || v == "" || v == "-") print "–"; else printf "%.*f\n", d, v }'; }
thousands() { awk -v v="$1" 'BEGIN { if (v == "NaN" || v == "") { print "–"; exit } s = sprintf("%.0f", v); o = ""
  while (length(s) > 3) { o = "," substr(s, length(s) - 2) o; s = substr(s, 1, length(s) - 3) } print s o }'; }
rss_mib() { awk -v v="$1" 'BEGIN { if (v == "NaN" || v == "" || v == "-") print "–"; else printf "%.0f\n", v / 1024 }'; }
col_max() { awk -v c="$1" -v k="$2" '$1 ~ c && $k != "-" { if ($k > m) m = $k } END { printf "%d\n", m }' "$RESULTS"; }
verdict() { if awk "BEGIN { exit !($1) }"; then echo "**met**"; else echo "**missed**"; fi; }
describe() {
  case "$1" in
    a-*) echo "(a) plain ACID transfer, pgbench, ${BEST_CLIENTS[$1]} clients" ;;
    b-*) echo "(b) naive 2PC recipe, 8 autocommits, pgbench, ${BEST_CLIENTS[$1]} clients" ;;
    c-*) echo "(c) sagapool on PostgreSQL, $WORKERS workers, saga-broker" ;;
    d-*) echo "(d) sagapool on SQLite, $WORKERS workers, saga-broker" ;;
    ck-*) echo "(c) sagapool on PostgreSQL, $WORKERS workers, real Kafka" ;;
    dk-*) echo "(d) sagapool on SQLite, $WORKERS workers, real Kafka" ;;
    e-1) echo "(e) sagapool on $SCALE_NAME, 1 worker" ;;
    e-*) echo "(e) sagapool on $SCALE_NAME, ${1#e-} workers" ;;
  esac
}
CPU_MODEL=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
MEM_GIB=$(awk '/^MemTotal:/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)
FS_TYPE=$(df -PT "$WORK" | awk 'NR == 2 { print $2 }')
SQLITE_VERSION=$(sqlite3 --version | cut -d' ' -f1)
RDKAFKA_VERSION=$(pkg-config --modversion rdkafka 2>/dev/null || echo "?")
SQLITE_SYNC=$(grep -o 'PRAGMA synchronous=[A-Z]*' "$ROOT/store/sqlite/src/sqlite_store.cpp" 2>/dev/null | head -1 | cut -d= -f2)
SQLITE_JOURNAL=$(grep -o 'PRAGMA journal_mode=[A-Z]*' "$ROOT/store/sqlite/src/sqlite_store.cpp" 2>/dev/null | head -1 | cut -d= -f2)
A_U=$(col_median a-uniform 3) A_Z=$(col_median a-zipf 3) B_U=$(col_median b-uniform 3) B_Z=$(col_median b-zipf 3)
C_U=$(col_median c-uniform 3) C_Z=$(col_median c-zipf 3) D_U=$(col_median d-uniform 3) D_Z=$(col_median d-zipf 3)
CK_U=$(col_median ck-uniform 3) CK_Z=$(col_median ck-zipf 3) DK_U=$(col_median dk-uniform 3) DK_Z=$(col_median dk-zipf 3)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
RSS_FULL=$(awk '$1 !~ /^half-/ && $7 != "-" { if ($7 > m) m = $7 } END { printf "%d", m }' "$RESULTS")
HALF_C_P99=$(col_median half-c 9) HALF_D_P99=$(col_median half-d 9)
D_MIN=$(awk -v a="$D_U" -v b="$D_Z" 'BEGIN { print (a < b ? a : b) }')
C_A_U=$(ratio "$C_U" "$A_U") C_A_Z=$(ratio "$C_Z" "$A_Z") C_B_U=$(ratio "$C_U" "$B_U") C_B_Z=$(ratio "$C_Z" "$B_Z")
CK_A_U=$(ratio "$CK_U" "$A_U") CK_A_Z=$(ratio "$CK_Z" "$A_Z")
DK_MIN=$(awk -v a="$DK_U" -v b="$DK_Z" 'BEGIN { print (a < b ? a : b) }')
{
  echo "# sagapool benchmarks"
  echo
  echo "Generated by \`./dev bench\` (\`bench/run.sh\`) on $(date -u '+%Y-%m-%d %H:%M UTC'); the whole run took $((BENCH_WALL / 60)) min $((BENCH_WALL % 60)) s."
  [ "$QUICK" = 1 ] && echo "**A \`--quick\` smoke run: small sizes, one repetition; not figures to quote.**"
  echo
  echo "$(thousands "$ACCOUNTS") accounts; account choice uniform or Zipf-skewed (s = 1.1: the most used account is"
  echo "in about one transfer in seven). Figures are medians of $REPS run(s) each$(
    [ ${#SKIPPED[@]} -gt 0 ] && printf ', except where the time budget cut repetitions: %s' "$(IFS=';'; echo "${SKIPPED[*]}" | sed 's/;/; /g')")."
  echo "Every sagapool run"
  echo "ended with \`sagactl audit\` passing; the baselines' tables balanced after pgbench."
  echo "Each sagapool run moved N transfers: $(thousands "${RUN_N[postgres]}") on PostgreSQL, $(thousands "${RUN_N[sqlite]}") on SQLite$(
    [ -z "$TRANSFERS" ] && echo " (what a $(thousands "$CALIBRATE_N")-transfer calibration run said each store finishes in about $RUN_S s)")."
  echo
  echo "## Targets"
  echo
  echo "| target | measured | |"
  echo "| --- | --- | --- |"
  echo "| c/a ≥ 2 (sagapool on PostgreSQL vs plain ACID) | uniform $C_A_U, Zipf $C_A_Z | $(verdict "$C_A_U >= 2 && $C_A_Z >= 2") |"
  echo "| c/b ≥ 8 (sagapool on PostgreSQL vs the naive recipe) | uniform $C_B_U, Zipf $C_B_Z | $(verdict "$C_B_U >= 8 && $C_B_Z >= 8") |"
  echo "| d ≥ 50,000 transfers/s (sagapool on SQLite) | uniform $(thousands "$D_U"), Zipf $(thousands "$D_Z") | $(verdict "$D_MIN >= 50000") |"
  echo "| c/a ≥ 2 on real Kafka | uniform $CK_A_U, Zipf $CK_A_Z | $(verdict "$CK_A_U >= 2 && $CK_A_Z >= 2") |"
  echo "| d ≥ 50,000 transfers/s on real Kafka | uniform $(thousands "$DK_U"), Zipf $(thousands "$DK_Z") | $(verdict "$DK_MIN >= 50000") |"
  echo "| p99 ≤ 250 ms at half load | (c) $(fmt "$HALF_C_P99") ms, (d) $(fmt "$HALF_D_P99") ms | $(verdict "$HALF_C_P99 <= 250 && $HALF_D_P99 <= 250") |"
  echo "| worker peak RSS ≤ 200 MiB at full load | $(rss_mib "$RSS_FULL") MiB | $(verdict "$RSS_FULL <= 200 * 1024") |"
  echo
  echo "## Figures"
  echo
  echo "| | accounts | transfers/s | latency p50 | latency p99 | CPU s / 1,000 transfers | worker peak RSS |"
  echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
  for cfg in a-uniform a-zipf b-uniform b-zipf c-uniform c-zipf ck-uniform ck-zipf d-uniform d-zipf dk-uniform dk-zipf e-1 e-2 e-4; do
    grep -q "^$cfg " "$RESULTS" || continue
    dist=${cfg#*-}; case "$cfg" in e-*) dist=zipf ;; esac
    echo "| $(describe "$cfg") | $dist | $(thousands "$(col_median "$cfg" 3)") | $(fmt "$(col_median "$cfg" 4)") ms | $(fmt "$(col_median "$cfg" 5)") ms | $(fmt "$(col_median "$cfg" 6)" 3) | $(case "$cfg" in a-*|b-*) echo "–" ;; *) echo "$(rss_mib "$(col_max "^$cfg\$" 7)") MiB" ;; esac) |"
  done
  while read -r which rate; do
    cfg=half-$which
    echo "| ($which) at half load: $(thousands "$rate")/s offered for $HALF_S s; latency after its first $((STEADY_AFTER_MS / 1000)) s | zipf | $(thousands "$(col_median "$cfg" 3)") | $(fmt "$(col_median "$cfg" 8)") ms | $(fmt "$(col_median "$cfg" 9)") ms | $(fmt "$(col_median "$cfg" 6)" 3) | $(rss_mib "$(col_max "^$cfg\$" 7)") MiB |"
  done <"$WORK/half-rates"
  echo
  echo "![transfers per second](throughput.png)"
  echo
  echo "Definitions:"
  echo
  echo "- **transfers/s**: (a), (b) pgbench's tps (one transaction script = one transfer) over"
  echo "  ${PGBENCH_S} s at the best client count of those tried ($CLIENTS; ${PROBE_S} s each);"
  echo "  sagapool: finished transfers / (last terminal-state time − first request timestamp),"
  echo "  as \`./dev demo\` computes it. The producer publishes the whole run at once, so full-load"
  echo "  latencies of sagapool are mostly queueing; the half-load rows are the latency figures."
  echo "- **warm-up**: each sagapool run first sends $(thousands "$WARMUP_N") transfers through the fresh pool and waits for"
  echo "  them; they are audited but left out of every figure (time, latency, CPU)."
  echo "- **latency**: sagapool: request timestamp (the Kafka message's) to the terminal state, from"
  echo "  the transfers table; pgbench: each transaction script's latency from its per-transaction log."
  echo "  The half-load rows leave out the requests of the run's first $((STEADY_AFTER_MS / 1000)) s: a fresh saga-producer stamps"
  echo "  its first messages before its idempotent producer has connected to the broker, and they wait up"
  echo "  to a second in its queue (\"Every run\" has both figures)."
  echo "- **CPU s / 1,000 transfers**: user + system CPU seconds, from /proc/PID/stat (children"
  echo "  reaped included), per 1,000 transfers: (a), (b) pgbench + every PostgreSQL server process;"
  echo "  (c) workers + broker + every PostgreSQL server process; (d), (e) on SQLite workers + broker."
  echo "  The producer's CPU is not counted (it is the load generator)."
  echo "- **worker peak RSS**: VmHWM of each worker process (/proc/PID/status) at the end of the run,"
  echo "  the largest of the workers and runs."
  echo "- **durability**: PostgreSQL with its defaults ($PG_SETTINGS); the"
  echo "  SQLite store as the workers configure it (journal_mode=${SQLITE_JOURNAL:-?}, synchronous=${SQLITE_SYNC:-?});"
  echo "  requests through the broker with the producer's enable.idempotence=true (so acks=all)."
  echo
  echo "## Machine"
  echo
  echo "- $(nproc) CPUs: $CPU_MODEL; ${MEM_GIB} GiB memory; Linux $(uname -r)"
  echo "- the data on $FS_TYPE; $DSYNC_RATE synchronous 8 kB writes per second there (\`dd oflag=dsync\`, one writer: what a commit's flush costs)"
  echo "- PostgreSQL $PG_VERSION, one server on loopback, max_connections=200, otherwise defaults"
  echo "- SQLite $SQLITE_VERSION; librdkafka $RDKAFKA_VERSION; saga-broker (librdkafka's mock cluster, $PARTITIONS partitions);"
  echo "  Apache Kafka 3.9.1, one KRaft node (tools/kafka/kafka.sh; JVM heap 256-512 MiB), topics of $PARTITIONS partitions, replication 1"
  echo "- binaries: Release build (\`./dev bench\` builds into build-release/)"
  echo "- load average when the bench started: $LOAD_AT_START"
  echo
  echo "## Commands"
  echo
  echo "Per sagapool run: a fresh copy of the ledger (CREATE DATABASE ... TEMPLATE, or a copy of the"
  echo "SQLite file), a fresh broker and worker pool; \`<...>\` are the run's own values."
  echo
  echo '```sh'
  echo "sagactl --store <store> init && sagactl --store <store> accounts import accounts.csv   # $ACCOUNTS accounts acct-0..acct-$((ACCOUNTS - 1))"
  echo "psql -v naccounts=$ACCOUNTS -v balance=$BALANCE -f bench/tables.sql                  # the baselines' tables"
  echo "pgbench -n -M prepared -c <best> -j <min(best, nproc)> -T $PGBENCH_S -D zipf=<0|1> -D naccounts=$ACCOUNTS -l -f bench/plain_transfer.sql   # (a)"
  echo "pgbench -n -M prepared -c <best> -j <min(best, nproc)> -T $PGBENCH_S -D zipf=<0|1> -D naccounts=$ACCOUNTS -l -f bench/tpc_transfer.sql     # (b)"
  echo "saga-broker --partitions $PARTITIONS --bootstrap-file <file>   # or, for the real-Kafka rows, once for the bench:"
  echo "tools/kafka/kafka.sh configure --brokers 1 --dir <dir> && tools/kafka/kafka.sh node --dir <dir> --node 1"
  echo "tools/kafka/kafka.sh topics --bootstrap <bootstrap> --partitions $PARTITIONS --replication 1 transfers.requests transfers.results transfers.dlq"
  echo "saga-worker --brokers <bootstrap> --group bench --store <postgresql://...|sqlite:...> --worker-id bench-<i> --metrics-addr 127.0.0.1:<port> --lease 10s   # × workers"
  echo "saga-producer --brokers <bootstrap> --generate <N> --accounts $ACCOUNTS --seed <run> --invalid-ratio 0 --overdraw-ratio 0 --unknown-ratio 0   # Zipf"
  echo "saga-producer --brokers <bootstrap> --file uniform.jsonl   # uniform: N valid requests, accounts drawn uniformly (awk, seed 7)"
  echo "saga-producer ... --rate <half of the median Zipf transfers/s>   # half load, for $HALF_S s"
  echo "sagactl --store <store> audit   # after the workers drained (SIGTERM, exit 0)"
  echo '```'
  echo
  echo "Run as: \`./dev bench$( [ ${#ARGS[@]} -gt 0 ] && printf ' %s' "${ARGS[@]}")\`."
  echo
  echo "## Every run"
  echo
  echo "| config | run | transfers/s | p50 ms | p99 ms | p50 / p99 ms after ${STEADY_AFTER_MS} ms | CPU s / 1k | worker peak RSS MiB |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  awk '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, ($8 == "-" ? "–" : $8 " / " $9), $6,
         ($7 == "-" ? "–" : sprintf("%.0f", $7 / 1024)) }' "$RESULTS"
  echo
  echo "$MARKER"
  printf '%s\n' "$HAND"
} >"$REPORT.new"
mv "$REPORT.new" "$REPORT"

# The chart: one bar per configuration, transfers/s.
{
  for cfg in a-uniform a-zipf b-uniform b-zipf c-uniform c-zipf ck-uniform ck-zipf d-uniform d-zipf dk-uniform dk-zipf e-1 e-2 e-4; do
    grep -q "^$cfg " "$RESULTS" || continue
    case "$cfg" in
      e-1) label="e: 1 worker" ;; e-*) label="e: ${cfg#e-} workers" ;;
      ?k-*) label="${cfg:0:1}: ${cfg#*-}, Kafka" ;;
      *) label="${cfg%%-*}: ${cfg#*-}" ;;
    esac
    printf '"%s" %s %d\n' "$label" "$(col_median "$cfg" 3)" "$(( $(printf '%d' "'${cfg:0:1}") - 96 ))"
  done
} >"$WORK/throughput.dat"
if command -v gnuplot >/dev/null; then
  gnuplot -e "datafile='$WORK/throughput.dat'; outfile='$OUT/throughput.png'; subtitle='$ACCOUNTS accounts, $(nproc) CPUs, median of $REPS; e on $SCALE_NAME, zipf'" \
    "$BENCH/throughput.gp" 2>"$WORK/gnuplot.log" || note "gnuplot failed: $(tail -1 "$WORK/gnuplot.log")"
else
  note "no chart: gnuplot is not installed (Debian package gnuplot-nox)"
fi
say "done in $(elapsed): $REPORT"
sed -n '/^## Targets/,/^## Machine/p' "$REPORT" | sed '$d'
