#!/usr/bin/env python3
"""Runs a real Prometheus against three fake saga-workers and checks that
every recording and alerting rule evaluates without error and that every
dashboard query returns data.

  prometheus_smoke.py PROMETHEUS RULES_DIR DASHBOARD.json

The fake workers serve, in the Prometheus text format, every metric of
DESIGN.md with plausible labels and counters that grow with time. This
checks the rules and queries against real scrapes and a real rule
evaluator; it says nothing about the real worker's exposition (the worker's
own tests do).
"""
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

START = time.time()
STATES = ["initial", "pending", "applied", "canceling", "done", "canceled"]


def exposition(worker):
    t = time.time() - START
    n = lambda per_s: int(per_s * t)  # noqa: E731  (a counter growing at per_s)
    lines = []

    def metric(name, kind, samples):
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            body = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{body}}} {value}" if body else f"{name} {value}")

    def histogram(name, labels, count_per_s, bounds, shares):
        lines.append(f"# TYPE {name} histogram")
        cum = 0.0
        for le, share in zip(bounds, shares):
            cum += share
            body = ",".join([f'{k}="{v}"' for k, v in labels.items()] + [f'le="{le}"'])
            lines.append(f"{name}_bucket{{{body}}} {n(count_per_s * cum)}")
        body = ",".join(f'{k}="{v}"' for k, v in labels.items())
        brace = f"{{{body}}}" if body else ""
        lines.append(f"{name}_bucket{{{body + ',' if body else ''}le=\"+Inf\"}} {n(count_per_s)}")
        lines.append(f"{name}_sum{brace} {count_per_s * t * 0.05:.3f}")
        lines.append(f"{name}_count{brace} {n(count_per_s)}")

    metric("saga_requests_total", "counter",
           [({"result": r}, n(v)) for r, v in
            [("accepted", 97), ("duplicate", 1), ("conflict", 1), ("invalid", 1)]])
    metric("saga_transfers_finished_total", "counter",
           [({"outcome": "done", "reason": "none"}, n(85)),
            ({"outcome": "canceled", "reason": "insufficient_funds"}, n(5))])
    metric("saga_stage_transitions_total", "counter",
           [({"from": "initial", "to": "pending"}, n(90)),
            ({"from": "pending", "to": "applied"}, n(85)),
            ({"from": "applied", "to": "done"}, n(85))])
    metric("saga_recoveries_total", "counter", [({"state": "pending"}, n(0.1))])
    metric("saga_compensations_total", "counter", [({"reason": "insufficient_funds"}, n(5))])
    metric("saga_dead_letters_total", "counter",
           [({"reason": "invalid"}, n(1)), ({"reason": "conflict"}, n(1))])
    metric("saga_store_errors_total", "counter", [({"op": "apply_legs"}, n(0.2))])
    for stage in ("debit", "credit", "cleanup"):
        histogram("saga_stage_duration_seconds", {"stage": stage}, 10,
                  ["0.001", "0.01", "0.1", "1"], [0.2, 0.6, 0.15, 0.05])
    histogram("saga_transfer_duration_seconds", {}, 90,
              ["0.05", "0.25", "1", "5"], [0.5, 0.4, 0.08, 0.02])
    histogram("saga_batch_size", {}, 10, ["1", "8", "64", "512"], [0.1, 0.4, 0.5, 0.0])
    now = int(time.time())
    metric("saga_transfers", "gauge", [({"state": s}, i * 10) for i, s in enumerate(STATES)])
    metric("saga_oldest_transfer_timestamp_seconds", "gauge",
           [({"state": s}, 0 if s == "applied" else now - 3) for s in STATES])
    metric("saga_stuck_transfers", "gauge", [({"state": s}, 0) for s in STATES[:4]])
    # Two stores: a batch is prepared on the second for an instant.
    metric("saga_prepared_batches", "gauge", [({"shard": "0"}, 0), ({"shard": "1"}, 1)])
    metric("saga_oldest_prepared_batch_timestamp_seconds", "gauge",
           [({"shard": "0"}, 0), ({"shard": "1"}, now - 1)])
    metric("saga_kafka_consumer_lag", "gauge",
           [({"topic": "transfers.requests", "partition": str(p)}, 5 + p)
            for p in range(worker * 2, worker * 2 + 2)])
    metric("saga_ledger_imbalance", "gauge", [({}, 0)])
    metric("saga_build_info", "gauge", [({"version": "0.1.0"}, 1)])
    return "\n".join(lines) + "\n"


def serve_worker(worker):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = exposition(worker).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def dashboard_exprs(path):
    with open(path, encoding="utf-8") as f:
        dash = json.load(f)
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "expr" in node:
                found.append((node.get("legendFormat") or node.get("refId", ""), node["expr"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for panel in dash.get("panels", []):
        for target in panel.get("targets", []):
            walk(target)
        for sub in panel.get("panels", []):
            for target in sub.get("targets", []):
                walk(target)
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*\w+\s*\)\s*", q)
        if m:
            found.append((f"variable {var.get('name')}", m.group(1)))
    return found


def main(argv):
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    prometheus, rules_dir, dashboard = argv[1:]
    workers = [serve_worker(i) for i in range(3)]
    tmp = tempfile.mkdtemp(prefix="saga-prom-")
    port = free_port()
    config = os.path.join(tmp, "prometheus.yml")
    targets = ", ".join(f"'127.0.0.1:{w.server_address[1]}'" for w in workers)
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {os.path.abspath(os.path.join(rules_dir, 'recording.yml'))}
  - {os.path.abspath(os.path.join(rules_dir, 'alerts.yml'))}
scrape_configs:
  - job_name: saga-worker
    static_configs:
      - targets: [{targets}]
""")
    log = open(os.path.join(tmp, "prometheus.log"), "w")
    proc = subprocess.Popen([prometheus, f"--config.file={config}",
                             f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    problems = []
    try:
        exprs = dashboard_exprs(dashboard)
        pending = {e for _, e in exprs}
        deadline = time.time() + 90
        while time.time() < deadline and pending:
            time.sleep(1)
            if proc.poll() is not None:
                problems.append(f"prometheus exited with {proc.returncode}")
                break
            for expr in sorted(pending):
                # namespace and release as Grafana's All sends them: this
                # Prometheus has neither label, as plain Prometheus has not.
                q = expr.replace("$job", "saga-worker").replace("$namespace", ".*").replace("$release", ".*")
                try:
                    res = get(f"{base}/api/v1/query?query={urllib.parse.quote(q)}")
                except OSError:
                    break  # not up yet
                if res.get("status") == "success" and res["data"]["result"]:
                    pending.discard(expr)
        for expr in sorted(pending):
            problems.append(f"dashboard query returned no data: {expr}")

        # Right after start-up a rate has a single sample and an alert may
        # go pending for an evaluation or two; give it a few evaluations to
        # settle before asking for every alert to be inactive.
        time.sleep(4)

        rules = get(f"{base}/api/v1/rules")["data"]["groups"] if proc.poll() is None else []
        count = 0
        for group in rules:
            for rule in group["rules"]:
                count += 1
                if rule.get("health") != "ok":
                    problems.append(f"rule {rule['name']} in {group['name']}: health "
                                    f"{rule.get('health')}: {rule.get('lastError')}")
                if rule.get("type") == "alerting" and rule.get("state") != "inactive":
                    problems.append(f"alert {rule['name']} is {rule['state']} on healthy workers")
        if proc.poll() is None and count == 0:
            problems.append("prometheus loaded no rules")
        print(f"{len(exprs)} dashboard queries, {count} rules checked against a real Prometheus")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        for w in workers:
            w.shutdown()
        if problems:
            with open(os.path.join(tmp, "prometheus.log")) as f:
                print(f.read()[-3000:], file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    for p in problems:
        print("FAIL: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
