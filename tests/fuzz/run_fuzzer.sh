#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time on its committed seed corpus
# (read only: new inputs go to a scratch folder) and fails on any crash,
# hang, leak or sanitizer report. Prints the executions and coverage reached.
#   run_fuzzer.sh FUZZER CORPUS_DIR DICT SECONDS WORK_DIR
set -euo pipefail
fuzzer=$1 corpus=$2 dict=$3 seconds=$4 work=$5
rm -rf "$work"
mkdir -p "$work/new" "$work/artifacts"
log="$work/fuzz.log"
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=70000 \
  -dict="$dict" -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
  "$work/new" "$corpus" >"$log" 2>&1 || status=$?
name=$(basename "$fuzzer")
if [ "$status" -ne 0 ]; then
  tail -n 60 "$log"
  echo "$name: FAILED (exit $status); reproduce with: $fuzzer $work/artifacts/<crash file>" >&2
  ls -l "$work/artifacts" >&2 || true
  exit 1
fi
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
seeds=$(find "$corpus" -type f | wc -l)
added=$(find "$work/new" -type f | wc -l)
echo "$name: ${runs:-?} executions in ${seconds} s, ${cov:-cov: ?} edges, ${seeds} seed inputs, ${added} new inputs kept; no crash, hang or sanitizer report"
