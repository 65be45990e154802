#!/usr/bin/env bash
# The demo: a local broker, a SQLite ledger of 1,000 accounts, 200,000
# generated transfers through 3 workers, a summary and an audit.
# Usage: tools/demo.sh BIN_DIR [--transfers N] [--workers N] [--keep]
set -euo pipefail
BIN=$1; shift
TRANSFERS=200000 WORKERS=3 ACCOUNTS=1000 KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --transfers) TRANSFERS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --postgres) echo "demo: --postgres needs the PostgreSQL backend (not built yet)" >&2; exit 2 ;;
    *) echo "demo: unknown option $1" >&2; exit 2 ;;
  esac
done

WORK=$(mktemp -d -t sagapool-demo-XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then echo "demo files kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
say() { printf '\033[1m%s\033[0m\n' "$*"; }
STORE="sqlite:$WORK/ledger.db"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
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

say "1/6 starting saga-broker"
"$BIN/saga-broker" --partitions 12 --bootstrap-file "$WORK/bootstrap" >"$WORK/broker.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WORK/bootstrap" ] && break; sleep 0.1; done
BROKERS=$(cat "$WORK/bootstrap")
echo "    brokers: $BROKERS"

say "2/6 creating the ledger: $ACCOUNTS accounts of 10,000,000 each"
"$BIN/sagactl" --store "$STORE" init >/dev/null
{ echo "id,balance"; for i in $(seq 0 $((ACCOUNTS - 1))); do echo "acct-$i,10000000"; done; } >"$WORK/accounts.csv"
"$BIN/sagactl" --store "$STORE" accounts import "$WORK/accounts.csv"

say "3/6 starting $WORKERS saga-worker processes (group demo)"
for i in $(seq 0 $((WORKERS - 1))); do
  "$BIN/saga-worker" --brokers "$BROKERS" --group demo --store "$STORE" --worker-id "worker-$i" \
    --metrics-addr "127.0.0.1:${PORTS[$i]}" --lease 10s >"$WORK/worker-$i.log" 2>&1 &
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
say "4/6 publishing $TRANSFERS generated transfers (2% invalid, some overdrawing or to unknown accounts)"
START=$(date +%s.%N)
"$BIN/saga-producer" --brokers "$BROKERS" --generate "$TRANSFERS" --accounts "$ACCOUNTS" --seed 42 \
  --invalid-ratio 0.02 --overdraw-ratio 0.02 --unknown-ratio 0.01 2>&1 | tee "$WORK/producer.out"
INVALID=$(sed -n 's/.* invalid \([0-9]*\).*/\1/p' "$WORK/producer.out" | tail -1)
VALID=$((TRANSFERS - ${INVALID:-0}))

say "5/6 waiting for every request to reach an outcome"
DEADLINE=$(( $(date +%s) + 150 ))
while :; do
  seen=$(sqlite3 "$WORK/ledger.db" "SELECT count(*) FROM transfers" 2>/dev/null || echo 0)
  open=$(sqlite3 "$WORK/ledger.db" "SELECT count(*) FROM transfers WHERE state NOT IN ('done','canceled') OR notified = 0" 2>/dev/null || echo "?")
  line="    valid requests ingested: $seen / $VALID, not yet finished and published: $open"
  if [ -t 1 ]; then printf '\r%s   ' "$line"; elif [ $((SECONDS % 3)) = 0 ]; then echo "$line"; fi
  if [ "$seen" -ge "$VALID" ] && [ "$open" = 0 ]; then break; fi
  if [ "$(date +%s)" -ge "$DEADLINE" ]; then echo; echo "demo: timed out waiting for outcomes" >&2; exit 1; fi
  sleep 0.5
done
echo
END=$(date +%s.%N)

say "6/6 summary"
DEAD=$(metric_sum saga_dead_letters_total)
SQL() { sqlite3 "$WORK/ledger.db" "$1"; }
FINISHED=$(SQL "SELECT count(*) FROM transfers")
SPAN_MS=$(SQL "SELECT max(finished_at) - min(requested_at) FROM transfers")
pct() { SQL "SELECT finished_at - requested_at AS ms FROM transfers ORDER BY ms LIMIT 1 OFFSET $((FINISHED * $1 / 100))"; }
echo "    transfers finished:  $FINISHED"
echo "    end-to-end rate:     $((FINISHED * 1000 / (SPAN_MS > 0 ? SPAN_MS : 1))) transfers/s (first request timestamp to last outcome)"
echo "    latency p50 / p99:   $(pct 50) ms / $(pct 99) ms (request timestamp to terminal state)"
SQL "SELECT '    outcome ' || state || (CASE WHEN reason = 'none' THEN '' ELSE ' (' || reason || ')' END) || ': ' || count(*)
     FROM transfers GROUP BY state, reason ORDER BY count(*) DESC"
echo "    dead letters:        $DEAD (invalid or conflicting requests, on transfers.dlq)"
awk -v a="$START" -v b="$END" 'BEGIN {printf "    wall time:           %.1f s from first publish to last outcome\n", b - a}'
echo
say "audit"
"$BIN/sagactl" --store "$STORE" audit | sed 's/^/    /'

for pid in "${PIDS[@]:1}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${PIDS[@]:1}"; do wait "$pid" || { echo "demo: a worker did not exit cleanly" >&2; exit 1; }; done
PIDS=("${PIDS[0]}")
say "demo finished: workers drained and exited 0"
