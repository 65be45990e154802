#!/usr/bin/env bash
# The demo: a local Apache Kafka (one KRaft node, tools/kafka/kafka.sh), a
# SQLite ledger of 1,000 accounts, 200,000 generated transfers through 3
# workers, a summary and an audit. --broker mock uses saga-broker
# (librdkafka's mock cluster, in memory) instead: quicker to start.
# With --postgres the ledger is two throwaway PostgreSQL servers, two shards
# of one ledger (initdb into the demo's folder, free loopback ports), stopped
# and removed at the end; --shards N picks how many (1..4). Its summary adds
# the store round trips per batch, from pg_stat_statements.
# With --mongodb the ledger is a throwaway FerretDB (MongoDB's wire protocol
# on SQLite, tools/mongodb/ferretdb.sh) in the demo's folder on a free
# loopback port, stopped at the end; progress and summary then come from the
# workers' /metrics (no MongoDB shell needed). It moves 1,000 transfers unless
# --transfers says otherwise: FerretDB scans a whole collection for every
# query that is not a lookup by _id (docs/mongodb.md).
# With --prometheus a local Prometheus scrapes the workers, with the alert and
# recording rules of monitoring/ loaded, until the demo ends. The summary
# plots throughput, latency and lag over time (gnuplot, PNG).
# --rate R publishes R requests per second instead of all at once (latency
# at a given load rather than under a backlog).
# Usage: tools/demo.sh BIN_DIR [--broker kafka|mock] [--postgres [--shards N] | --mongodb] [--prometheus] [--transfers N] [--rate R] [--workers N] [--accounts N] [--keep]
set -euo pipefail
BIN=$1; shift
PROMETHEUS=0 OBS_PIDS=()  # --prometheus; the sampler's and Prometheus' pids
TRANSFERS="" RATE=0 WORKERS=3 ACCOUNTS=1000 KEEP=0 POSTGRES=0 MONGODB=0 SHARDS=2 BROKER=kafka
while [ $# -gt 0 ]; do
  case "$1" in
    --broker) BROKER=$2; shift 2 ;;
    --transfers) TRANSFERS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --accounts) ACCOUNTS=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --prometheus) PROMETHEUS=1; shift ;;
    --postgres) POSTGRES=1; shift ;;
    --mongodb) MONGODB=1; shift ;;
    --shards) SHARDS=$2; shift 2 ;;
    *) echo "demo: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$SHARDS" in
  1|2|3|4) ;;
  *) echo "demo: --shards takes 1 to 4" >&2; exit 2 ;;
esac
case "$ACCOUNTS" in
  ''|0*|*[!0-9]*) echo "demo: --accounts takes a positive number" >&2; exit 2 ;;
esac
case "$BROKER" in
  kafka|mock) ;;
  *) echo "demo: --broker takes kafka or mock" >&2; exit 2 ;;
esac
[ "$POSTGRES" = 1 ] && [ "$MONGODB" = 1 ] && { echo "demo: --postgres or --mongodb, not both" >&2; exit 2; }
[ -n "$TRANSFERS" ] || { [ "$MONGODB" = 1 ] && TRANSFERS=1000 || TRANSFERS=200000; }

WORK=$(mktemp -d -t sagapool-demo-XXXXXX)
PIDS=()
PG_DIRS=()  # data folders of the PostgreSQL servers started (--postgres)
FERRET_PID=""  # tools/mongodb/ferretdb.sh run (--mongodb)
cleanup() {
  for pid in "${PIDS[@]}" "${OBS_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  # The store goes last, once the workers are gone.
  for pid in "${PIDS[@]}" "${OBS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -z "$FERRET_PID" ] || kill "$FERRET_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  for dir in "${PG_DIRS[@]}"; do pg_stop "$dir"; done
  if [ "$KEEP" = 1 ]; then echo "demo files kept in $WORK"
  elif [ -d "$WORK/plots" ]; then  # the plots outlive the demo
    find "$WORK" -mindepth 1 -maxdepth 1 ! -name plots -exec rm -rf {} +
    echo "plots kept in $WORK/plots"
  else rm -rf "$WORK"; fi
}
trap cleanup EXIT
say() { printf '\033[1m%s\033[0m\n' "$*"; }
# port_free, and the throwaway PostgreSQL servers (pg_init_tools, pg_start, pg_stop).
LIB_NAME=demo
# shellcheck source=tools/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Statements the workers ran on each shard (each one round trip), per batch
# of requests, by stage.
pg_round_trips() {
  local batches requests n line total=0 lines=()
  batches=$(metric_sum saga_batch_size_count)
  requests=$(metric_sum saga_batch_size_sum)
  [ "${batches:-0}" -gt 0 ] || return 0
  for n in $(seq "$SHARDS"); do
    line=$("$PG_BIN/psql" -XqAt -F' ' -d "${PG_URLS[$((n - 1))]}" -c "
      WITH ops(ord, op, pattern) AS (VALUES (1, 'insert', 'SELECT r FROM saga_insert_transfers(%'),
        (1, 'insert', 'SELECT CASE%LEFT JOIN saga_transfers t ON t.id = u.id%'),
        (2, 'transition', 'SELECT r FROM saga_transition_at(%'),
        (2, 'transition', 'WITH now AS (%INSERT INTO saga_transfers%'),
        (3, 'plan', 'SELECT % FROM saga_accounts WHERE id = ANY (%'),
        (3, 'plan', 'SELECT % FROM saga_load_accounts_locked(%'),
        (4, 'legs', 'SELECT % FROM saga_apply_legs(%'),
        (4, 'settle', 'SELECT % FROM saga_settle_batch(%'),
        (5, 'prepare', 'PREPARE TRANSACTION%'),
        (6, 'commit prepared', 'COMMIT PREPARED%')),
      calls AS (SELECT ord, op, sum(s.calls) AS n FROM ops JOIN pg_stat_statements s
        ON s.query LIKE ops.pattern
        AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
        GROUP BY ord, op)
      SELECT to_char(sum(n) / $batches, 'FM99990.00'), string_agg(op || ' ' ||
        to_char(n / $batches, 'FM99990.00'), ', ' ORDER BY ord) FROM calls")
    [ -n "$line" ] || line="0 -"
    total=$(awk -v a="$total" -v b="${line%% *}" 'BEGIN {printf "%.2f", a + b}')
    lines+=("      shard $n: ${line%% *} (${line#* })")
  done
  echo "    store round trips:   $total per batch of requests ($batches batches of $((requests / batches)) on average; one statement each)"
  printf '%s\n' "${lines[@]}"
  echo "      recovery polls:  $(SQL "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE 'SELECT % FROM saga_claim_expired(%'") claim_expired calls in all (each worker, every recovery interval)"
}

STORES=()  # the --store flags, in `sagactl init` order
if [ "$POSTGRES" = 1 ] || [ "$MONGODB" = 1 ]; then
  trap 'exit 130' INT  # so the EXIT trap stops the servers on ^C and kill too
  trap 'exit 143' TERM
fi
if [ "$POSTGRES" = 1 ]; then
  say "0/6 starting $SHARDS throwaway PostgreSQL server(s), one per shard of the ledger"
  pg_init_tools
  # fsync off: a throwaway server (a killed server still keeps every commit;
  # only a machine crash could lose them). Prepared transactions: batches
  # across shards commit in two phases, one per connection at most.
  PG_SERVER_OPTS="-c fsync=off -c full_page_writes=off -c max_connections=60 -c max_prepared_transactions=100 -c shared_buffers=128MB $PG_STATS"
  PG_URLS=()
  for n in $(seq "$SHARDS"); do
    pg_start "pg-$n"
    PG_URLS+=("$PG_URL")
    STORES+=(--store "$PG_URL")
    echo "    shard $n: $PG_URL ($("$PG_BIN/postgres" --version))"
  done
  # The summary's queries, on the first store (it holds the transfer documents).
  SQL() { "$PG_BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "${PG_URLS[0]}" -c "$1"; }
  T=saga_transfers REQUESTED=requested_at_ms FINISHED_AT=finished_at_ms
  NO_REASON="reason IS NULL" UNNOTIFIED="NOT notified"
elif [ "$MONGODB" = 1 ]; then
  say "0/6 starting a throwaway FerretDB (MongoDB's wire protocol on SQLite)"
  FERRETDB="$(dirname "${BASH_SOURCE[0]}")/mongodb/ferretdb.sh"
  "$FERRETDB" fetch  # at once when ./dev build has (a minute's build otherwise)
  MONGO_URL=""
  # A port free a moment ago can be taken when the server binds it: try a few.
  for attempt in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 30000))
    port_free "$port" || continue
    "$FERRETDB" run --dir "$WORK/ferretdb" --port "$port" >"$WORK/ferretdb.out" 2>&1 &
    FERRET_PID=$!
    for _ in $(seq 600); do
      grep -q '^mongodb://' "$WORK/ferretdb.out" && break
      kill -0 "$FERRET_PID" 2>/dev/null || break
      sleep 0.1
    done
    if grep -q '^mongodb://' "$WORK/ferretdb.out"; then
      MONGO_URL="$(grep -m1 '^mongodb://' "$WORK/ferretdb.out")sagapool"
      break
    fi
    kill "$FERRET_PID" 2>/dev/null || true
    wait "$FERRET_PID" 2>/dev/null || true
    FERRET_PID=""
  done
  [ -n "$MONGO_URL" ] || { cat "$WORK/ferretdb.out" >&2; echo "demo: FerretDB did not start" >&2; exit 1; }
  STORES+=(--store "$MONGO_URL")
  echo "    store: $MONGO_URL (folder $WORK/ferretdb)"
else
  STORES+=(--store "sqlite:$WORK/ledger.db")
  SQL() { sqlite3 "$WORK/ledger.db" "$1"; }
  T=transfers REQUESTED=requested_at FINISHED_AT=finished_at
  NO_REASON="reason = 'none'" UNNOTIFIED="notified = 0"
fi
PORTS=()  # metrics ports, from 9464 up, skipping busy ones
port=9464
while [ ${#PORTS[@]} -lt "$WORKERS" ]; do
  port_free "$port" && PORTS+=("$port")
  port=$((port + 1))
done
metric_sum() {  # metric_sum NAME: sum of a metric over the workers' /metrics
  local total=0 v
  for p in "${PORTS[@]}"; do
    v=$(curl -sf "http://127.0.0.1:$p/metrics" 2>/dev/null |
        awk -v m="$1" '$1 ~ "^"m"({|$)" {s += $2} END {printf "%d", s}') || v=0
    total=$((total + ${v:-0}))
  done
  echo "$total"
}
# --mongodb: the store takes no SQL, so the wait and the summary read the
# workers' /metrics instead. scrape_all: every worker's, one after the other.
scrape_all() {
  local p
  for p in "${PORTS[@]}"; do curl -sf --max-time 2 "http://127.0.0.1:$p/metrics" 2>/dev/null || true; done
}
# Transfers not yet finished, or finished with their outcome not yet
# published, from the first worker's store gauges (every worker reports the
# same store; the gauges are cached for a second or more); "?" if it has none.
store_open() {
  curl -sf --max-time 2 "http://127.0.0.1:${PORTS[0]}/metrics" 2>/dev/null |
    awk '/^(saga_transfers|saga_unpublished_outcomes)[{ ]/ { s += $2; seen = 1 }
         END { if (seen) printf "%d", s; else print "?" }' || true
}
# The Q-quantile (0-1) of saga_transfer_duration_seconds over the workers, in
# ms, interpolated in the buckets as histogram_quantile does.
duration_quantile() {
  scrape_all | awk -v q="$1" '
    /^saga_transfer_duration_seconds_bucket[{]/ {
      match($1, /le="[^"]*"/); le = substr($1, RSTART + 4, RLENGTH - 5)
      if (!(le in b)) order[n++] = le
      b[le] += $2
    }
    END {
      if (n == 0 || b[order[n - 1]] == 0) { print "?"; exit }
      target = q * b[order[n - 1]]; lo = 0; prev = 0
      for (i = 0; i < n; i++) {
        c = b[order[i]]
        if (c >= target) {
          if (order[i] == "+Inf") printf "%.0f", lo * 1000
          else printf "%.0f", (lo + (order[i] - lo) * (c > prev ? (target - prev) / (c - prev) : 1)) * 1000
          exit
        }
        prev = c; lo = order[i]
      }
    }'
}
# "    outcome STATE (REASON): N" lines, most first, from saga_transfers_finished_total.
metric_outcomes() {
  scrape_all | awk '
    /^saga_transfers_finished_total[{]/ {
      match($1, /outcome="[^"]*"/); o = substr($1, RSTART + 9, RLENGTH - 10)
      match($1, /reason="[^"]*"/); r = substr($1, RSTART + 8, RLENGTH - 9)
      n[o (r == "none" || r == "" ? "" : " (" r ")")] += $2
    }
    END { for (k in n) if (n[k] > 0) printf "%d %s\n", n[k], k }' |
    sort -rn | awk '{ c = $1; $1 = ""; printf "    outcome%s: %d\n", $0, c }'
}

if [ "$BROKER" = kafka ]; then
  say "1/6 starting Apache Kafka: one KRaft node, 12 partitions a topic"
  KAFKA="$(dirname "${BASH_SOURCE[0]}")/kafka/kafka.sh"
  "$KAFKA" run --brokers 1 --dir "$WORK/kafka" >"$WORK/kafka.out" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 240); do
    grep -q '^bootstrap: ' "$WORK/kafka.out" && break
    kill -0 "${PIDS[-1]}" 2>/dev/null || break
    sleep 0.5
  done
  BROKERS=$(sed -n 's/^bootstrap: //p' "$WORK/kafka.out")
  [ -n "$BROKERS" ] || { cat "$WORK/kafka.out" >&2; echo "demo: Kafka did not start" >&2; exit 1; }
  "$KAFKA" topics --bootstrap "$BROKERS" --partitions 12 --replication 1 \
    transfers.requests transfers.results transfers.dlq
else
  say "1/6 starting saga-broker (librdkafka's mock cluster)"
  "$BIN/saga-broker" --partitions 12 --bootstrap-file "$WORK/bootstrap" >"$WORK/broker.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do [ -s "$WORK/bootstrap" ] && break; sleep 0.1; done
  BROKERS=$(cat "$WORK/bootstrap")
fi
echo "    brokers: $BROKERS"

say "2/6 creating the ledger: $ACCOUNTS accounts of 10,000,000 each"
"$BIN/sagactl" "${STORES[@]}" init >/dev/null
{ echo "id,balance"; for i in $(seq 0 $((ACCOUNTS - 1))); do echo "acct-$i,10000000"; done; } >"$WORK/accounts.csv"
"$BIN/sagactl" "${STORES[@]}" accounts import "$WORK/accounts.csv"
if [ "$POSTGRES" = 1 ]; then
  for n in $(seq "$SHARDS"); do
    echo "    shard $n holds $("$PG_BIN/psql" -XqAt -d "${PG_URLS[$((n - 1))]}" -c "SELECT count(*) FROM saga_accounts") accounts"
  done
fi

# FerretDB scans a whole collection for every query but a lone _id, so on
# it batches stay small (docs/mongodb.md).
WORKER_FLAGS=(); [ "$MONGODB" = 1 ] && WORKER_FLAGS=(--batch-size 10)
say "3/6 starting $WORKERS saga-worker processes (group demo)"
for i in $(seq 0 $((WORKERS - 1))); do
  "$BIN/saga-worker" --brokers "$BROKERS" --group demo "${STORES[@]}" --worker-id "worker-$i" \
    --metrics-addr "127.0.0.1:${PORTS[$i]}" --lease 10s "${WORKER_FLAGS[@]}" >"$WORK/worker-$i.log" 2>&1 &
  PIDS+=($!)
done

# Publish once every worker holds partitions, so the group does not
# rebalance (and re-deliver) while the burst arrives.
for _ in $(seq 100); do
  n=$(cat "$WORK"/worker-*.log 2>/dev/null | grep -c "rebalance: assigned" || true)
  [ "$n" -ge "$WORKERS" ] && break
  sleep 0.2
done
sleep 1

# ---- observability (--prometheus, plots) ------------------------------------
OBS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROM_URL=""
if [ "$PROMETHEUS" = 1 ]; then
  command -v prometheus >/dev/null || { echo "demo: --prometheus needs Debian's prometheus package" >&2; exit 1; }
  PROM_PORT=9090
  until port_free "$PROM_PORT"; do PROM_PORT=$((PROM_PORT + 1)); done
  mkdir -p "$WORK/prometheus/rules"
  cp "$OBS_ROOT"/monitoring/rules/*.yml "$WORK/prometheus/rules/"
  # monitoring/prometheus.yml with this demo's worker ports and its own port.
  targets=""
  for p in "${PORTS[@]}"; do targets+="          - 127.0.0.1:$p"$'\n'; done
  awk -v targets="$targets" -v self="127.0.0.1:$PROM_PORT" '
    /^ *- 127\.0\.0\.1:94[0-9][0-9] *$/ { if (!done) printf "%s", targets; done = 1; next }
    { sub(/127\.0\.0\.1:9090/, self); print }' \
    "$OBS_ROOT/monitoring/prometheus.yml" >"$WORK/prometheus/prometheus.yml"
  prometheus --config.file="$WORK/prometheus/prometheus.yml" --storage.tsdb.path="$WORK/prometheus/data" \
    --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
  OBS_PIDS+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1 && break; sleep 0.2; done
  curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1 ||
    { echo "demo: Prometheus did not start:" >&2; tail -20 "$WORK/prometheus.log" >&2; exit 1; }
  PROM_URL="http://127.0.0.1:$PROM_PORT"
  echo "    Prometheus: $PROM_URL (alerts: $PROM_URL/alerts, rules from monitoring/rules; up until the demo ends)"
fi
# Every 0.5 s, the workers' /metrics summed: time, finished transfers,
# transfer-duration count and sum, consumer lag, then the duration
# histogram's cumulative buckets as le:count.
sample_metrics() {
  local now
  now=$(date +%s.%N)
  for p in "${PORTS[@]}"; do curl -sf --max-time 2 "http://127.0.0.1:$p/metrics" 2>/dev/null || true; done |
    awk -v t="$now" '
      /^saga_transfers_finished_total[{ ]/ { fin += $2 }
      /^saga_transfer_duration_seconds_count[{ ]/ { cnt += $2 }
      /^saga_transfer_duration_seconds_sum[{ ]/ { sum += $2 }
      /^saga_kafka_consumer_lag[{ ]/ { lag += $2 }
      /^saga_transfer_duration_seconds_bucket[{]/ {
        match($1, /le="[^"]*"/); le = substr($1, RSTART + 4, RLENGTH - 5)
        if (!(le in b)) order[n++] = le
        b[le] += $2
      }
      END {
        printf "%s %d %d %.6f %d", t, fin, cnt, sum, lag
        for (i = 0; i < n; i++) printf " %s:%d", order[i], b[order[i]]
        print ""
      }'
}
( while :; do sample_metrics; sleep 0.5; done ) >"$WORK/metrics.samples" 2>/dev/null &
OBS_PIDS+=($!)
SAMPLER_PID=$!

say "4/6 publishing $TRANSFERS generated transfers (2% invalid, some overdrawing or to unknown accounts)"
START=$(date +%s.%N)
"$BIN/saga-producer" --brokers "$BROKERS" --generate "$TRANSFERS" --accounts "$ACCOUNTS" --seed 42 --rate "$RATE" \
  --invalid-ratio 0.02 --overdraw-ratio 0.02 --unknown-ratio 0.01 2>&1 | tee "$WORK/producer.out"
INVALID=$(sed -n 's/.* invalid \([0-9]*\).*/\1/p' "$WORK/producer.out" | tail -1)
VALID=$((TRANSFERS - ${INVALID:-0}))

say "5/6 waiting for every request to reach an outcome"
DEADLINE=$(( $(date +%s) + 150 ))
ALL_FINISHED=""  # --mongodb: when the workers had finished every valid request
while :; do
  if [ "$MONGODB" = 1 ]; then
    # Each transfer finishes once (the terminal write is conditional); the
    # store's gauges count only once read 2 s after the last one finished,
    # so a cached reading from before cannot end the wait.
    seen=$(metric_sum saga_transfers_finished_total)
    open=$(store_open)
    line="    valid requests finished: $seen / $VALID, not yet finished and published: $open"
    if [ -z "$ALL_FINISHED" ] && [ "$seen" -ge "$VALID" ]; then ALL_FINISHED=$(date +%s.%N); fi
    settled=0
    [ -n "$ALL_FINISHED" ] && awk -v t="$ALL_FINISHED" -v now="$(date +%s.%N)" 'BEGIN {exit !(now >= t + 2)}' && settled=1
  else
    # The store is counted only once the workers say all are finished:
    # counting a table that grows through the run twice a second slowed the
    # run more the longer it went.
    seen=$(metric_sum saga_transfers_finished_total)
    open="?"
    if [ "$seen" -ge "$VALID" ]; then
      seen=$(SQL "SELECT count(*) FROM $T" 2>/dev/null || echo 0)
      open=$(SQL "SELECT count(*) FROM $T WHERE state NOT IN ('done','canceled') OR $UNNOTIFIED" 2>/dev/null || echo "?")
    fi
    line="    valid requests finished: $seen / $VALID"
    settled=1
  fi
  if [ -t 1 ]; then printf '\r%s   ' "$line"; elif [ $((SECONDS % 3)) = 0 ]; then echo "$line"; fi
  if [ "$seen" -ge "$VALID" ] && [ "$open" = 0 ] && [ "$settled" = 1 ]; then break; fi
  if [ "$(date +%s)" -ge "$DEADLINE" ]; then echo; echo "demo: timed out waiting for outcomes" >&2; exit 1; fi
  sleep 0.5
done
echo
END=${ALL_FINISHED:-$(date +%s.%N)}

say "6/6 summary"
DEAD=$(metric_sum saga_dead_letters_total)
if [ "$MONGODB" = 1 ]; then
  FINISHED=$(metric_sum saga_transfers_finished_total)
  SPAN_MS=$(awk -v a="$START" -v b="$END" 'BEGIN {printf "%d", (b - a) * 1000}')
  echo "    transfers finished:  $FINISHED"
  echo "    end-to-end rate:     $((FINISHED * 1000 / (SPAN_MS > 0 ? SPAN_MS : 1))) transfers/s (first publish to last terminal state)"
  echo "    latency p50 / p99:   $(duration_quantile 0.5) ms / $(duration_quantile 0.99) ms (request timestamp to terminal state; from the histogram buckets)"
  metric_outcomes
else
  FINISHED=$(SQL "SELECT count(*) FROM $T")
  SPAN_MS=$(SQL "SELECT max($FINISHED_AT) - min($REQUESTED) FROM $T")
  pct() { SQL "SELECT $FINISHED_AT - $REQUESTED AS ms FROM $T ORDER BY ms LIMIT 1 OFFSET $((FINISHED * $1 / 100))"; }
  echo "    transfers finished:  $FINISHED"
  echo "    end-to-end rate:     $((FINISHED * 1000 / (SPAN_MS > 0 ? SPAN_MS : 1))) transfers/s (first request timestamp to last outcome)"
  echo "    latency p50 / p99:   $(pct 50) ms / $(pct 99) ms (request timestamp to terminal state)"
  SQL "SELECT '    outcome ' || state || (CASE WHEN $NO_REASON THEN '' ELSE ' (' || reason || ')' END) || ': ' || count(*)
       FROM $T GROUP BY state, reason ORDER BY count(*) DESC"
fi
echo "    dead letters:        $DEAD (invalid or conflicting requests, on transfers.dlq)"
awk -v a="$START" -v b="$END" 'BEGIN {printf "    wall time:           %.1f s from first publish to last outcome\n", b - a}'
[ "$POSTGRES" = 1 ] && [ -n "$PG_STATS" ] && pg_round_trips
# ---- plots: throughput, latency and lag over time, from the samples ---------
kill "$SAMPLER_PID" 2>/dev/null || true
wait "$SAMPLER_PID" 2>/dev/null || true
mkdir -p "$WORK/plots"
# Per interval between two samples: finished/s, mean, p50 and p99 latency in
# ms (interpolated in the histogram buckets, like histogram_quantile), lag.
awk -v start="$START" '
  function q(p,   target, i, lo, prev, c) {
    target = p * dcnt; prev = 0; lo = 0
    for (i = 0; i < nb; i++) {
      c = cur[i] - last[i]
      if (c >= target) {
        if (le[i] == "+Inf") return lo * 1000
        return (lo + (le[i] - lo) * (c > prev ? (target - prev) / (c - prev) : 1)) * 1000
      }
      prev = c; lo = le[i]
    }
    return lo * 1000
  }
  {
    nb = 0
    for (i = 6; i <= NF; i++) { split($i, kv, ":"); le[nb] = kv[1]; cur[nb] = kv[2]; nb++ }
    if (NR > 1 && $1 > t) {
      dt = $1 - t; dfin = $2 - fin; dcnt = $3 - cnt; dsum = $4 - sum
      if (dfin < 0) dfin = 0
      if (dcnt > 0) printf "%.2f %.1f %.2f %.2f %.2f %d\n", $1 - start, dfin / dt, dsum / dcnt * 1000, q(0.5), q(0.99), $5
      else printf "%.2f %.1f NaN NaN NaN %d\n", $1 - start, dfin / dt, $5
    }
    t = $1; fin = $2; cnt = $3; sum = $4
    for (i = 0; i < nb; i++) last[i] = cur[i]
  }' "$WORK/metrics.samples" >"$WORK/plots/timeline.dat"
PLOT="$WORK/plots/throughput-latency.png"
if ! command -v gnuplot >/dev/null; then
  echo "    plots:               skipped (gnuplot not installed; Debian package gnuplot-nox)"
elif [ ! -s "$WORK/plots/timeline.dat" ]; then
  echo "    plots:               skipped (no metrics were sampled)"
elif gnuplot <<GNUPLOT 2>"$WORK/plots/gnuplot.log"; then
set terminal pngcairo size 1100,900 font ",10"
set output "$PLOT"
set multiplot layout 3,1 title "sagapool demo: $TRANSFERS transfers, $WORKERS workers (from the workers' /metrics, every 0.5 s)"
set grid
set key top right
set xrange [0:*]
set ylabel "transfers/s"
plot "$WORK/plots/timeline.dat" using 1:2 with lines lw 2 title "finished"
set ylabel "latency (ms)"
set logscale y
plot "$WORK/plots/timeline.dat" using 1:5 with lines lw 2 title "p99", "" using 1:4 with lines lw 2 title "p50", \
     "" using 1:3 with lines title "mean"
unset logscale y
set ylabel "messages"
set xlabel "seconds since the first publish"
plot "$WORK/plots/timeline.dat" using 1:6 with lines lw 2 title "consumer lag"
unset multiplot
GNUPLOT
  echo "    plots:               $PLOT"
  echo "                         (finished transfers/s; end-to-end latency: mean, p50/p99 estimated from"
  echo "                         the histogram buckets; consumer lag; over time)"
else
  echo "    plots:               gnuplot failed: $(tail -1 "$WORK/plots/gnuplot.log")"
fi
if [ -n "$PROM_URL" ]; then
  alerts=$(curl -sf "$PROM_URL/api/v1/alerts" | python3 -c 'import json, sys
a = json.load(sys.stdin)["data"]["alerts"]
print(", ".join(sorted(x["labels"]["alertname"] + " (" + x["state"] + ")" for x in a)) or "none")' 2>/dev/null) ||
    alerts="? (no answer)"
  echo "    Prometheus alerts:   $alerts, at $PROM_URL/alerts"
fi
echo
say "audit"
"$BIN/sagactl" "${STORES[@]}" audit | sed 's/^/    /'

for pid in "${PIDS[@]:1}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${PIDS[@]:1}"; do wait "$pid" || { echo "demo: a worker did not exit cleanly" >&2; exit 1; }; done
PIDS=("${PIDS[0]}")
say "demo finished: workers drained and exited 0"
if [ -n "$PROM_URL" ] && [ -t 0 ] && [ -t 1 ]; then
  say "Prometheus is still up at $PROM_URL; press Enter to stop it and end the demo"
  read -r _ || true
fi
