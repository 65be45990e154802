#!/usr/bin/env python3
"""Static checks of sagapool's monitoring files (stdlib only).

  check_monitoring.py dashboard DASHBOARD.json RECORDING.yml [--design DESIGN.md] [--promtool PROMTOOL]
      valid JSON; every PromQL expression names only metrics of DESIGN.md
      ("Metrics") or recording rules; the datasource is the templated
      variable `datasource` and no UID is hard-coded; with --promtool, every
      expression also parses.
  check_monitoring.py alerts ALERTS.yml RUNBOOKS.md TEST.yml [TEST.yml ...]
      every alert has for:, severity, summary, description and a runbook_url
      whose anchor is a heading of RUNBOOKS.md; every alert has a unit test
      where it is silent and one where it fires with its annotations.
  check_monitoring.py docs METRICS.md RUNBOOKS.md ALERTS.yml RECORDING.yml [--design DESIGN.md]
      docs/metrics.md has a section per DESIGN.md metric and names every
      alert and recording rule; docs/runbooks.md has a section per alert.

The metric list below is DESIGN.md's "Metrics" section. When a DESIGN.md is
given, the two must agree, so a change to the contract shows up here.
"""
import json
import re
import subprocess
import sys
import tempfile

DESIGN_METRICS = {
    "saga_requests_total": "counter",
    "saga_transfers_finished_total": "counter",
    "saga_stage_transitions_total": "counter",
    "saga_stage_duration_seconds": "histogram",
    "saga_transfer_duration_seconds": "histogram",
    "saga_transfers": "gauge",
    "saga_oldest_transfer_timestamp_seconds": "gauge",
    "saga_stuck_transfers": "gauge",
    "saga_recoveries_total": "counter",
    "saga_compensations_total": "counter",
    "saga_dead_letters_total": "counter",
    "saga_store_errors_total": "counter",
    "saga_batch_size": "histogram",
    "saga_kafka_consumer_lag": "gauge",
    "saga_ledger_imbalance": "gauge",
    "saga_build_info": "gauge",
}

RUNBOOK_PREFIX = "https://github.com/sagapool/sagapool/blob/main/docs/runbooks.md#"
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "inf", "nan", "atan2"}

errors = []


def fail(msg):
    errors.append(msg)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def design_metrics(path):
    """Metric names in DESIGN.md's "## Metrics" section."""
    text = read(path)
    m = re.search(r"^## Metrics\b.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        fail(f"{path}: no '## Metrics' section")
        return set()
    return set(re.findall(r"\bsaga_[a-z0-9_]+", m.group(1)))


def check_design(path):
    if not path:
        return
    found = design_metrics(path)
    if found and found != set(DESIGN_METRICS):
        fail(f"{path} lists {sorted(found ^ set(DESIGN_METRICS))} differently from "
             "DESIGN_METRICS in check_monitoring.py: update it and docs/metrics.md")


def recorded_names(path):
    return set(re.findall(r"^\s*-?\s*record:\s*([A-Za-z_:][A-Za-z0-9_:]*)", read(path), re.M))


def allowed_series():
    names = set()
    for name, kind in DESIGN_METRICS.items():
        names.add(name)
        if kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def metric_names(expr):
    """Metric names an expression selects (a small PromQL tokenizer)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    names = []
    for m in re.finditer(r"(?<![\w.:$])[A-Za-z_:][A-Za-z0-9_:]*", e):
        tok = m.group(0)
        if tok.lower() in KEYWORDS:
            continue
        if re.match(r"\s*\(", e[m.end():]):
            continue  # a function or aggregation
        names.append(tok)
    return names


def walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")


def is_ds_ref(value):
    return value in ("${datasource}", "$datasource")


def check_dashboard(dash_path, recording_path, design_path, promtool):
    check_design(design_path)
    try:
        dash = json.loads(read(dash_path))
    except (OSError, ValueError) as e:
        fail(f"{dash_path}: not valid JSON: {e}")
        return
    known = allowed_series() | recorded_names(recording_path)

    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds_var = variables.get("datasource")
    if not ds_var or ds_var.get("type") != "datasource" or ds_var.get("query") != "prometheus":
        fail(f"{dash_path}: needs a templating variable 'datasource' of type datasource, query prometheus")
    # Links and provisioning find the dashboard by its uid; one deployment
    # among several is picked by namespace and Helm release.
    if not re.fullmatch(r"[a-z0-9-]{1,40}", str(dash.get("uid") or "")):
        fail(f"{dash_path}: needs a stable uid (lower-case letters, digits, dashes)")
    for name in ("job", "namespace", "release"):
        if name not in variables:
            fail(f"{dash_path}: needs a templating variable {name!r}")
    for name in ("namespace", "release"):
        var = variables.get(name, {})
        if not var.get("includeAll") or var.get("allValue") != ".*":
            fail(f"{dash_path}: variable {name!r} must allow All as .* (plain Prometheus has no such label)")

    exprs = []
    for where, node in walk(dash):
        if where == "$":
            continue  # the dashboard's own uid, checked above
        if "uid" in node and node["uid"] is not None and not is_ds_ref(node["uid"]):
            fail(f"{dash_path}: {where}.uid is hard-coded ({node['uid']!r}); use ${{datasource}}")
        if "datasource" in node:
            ds = node["datasource"]
            ok = (isinstance(ds, dict) and ds.get("type") == "prometheus" and is_ds_ref(ds.get("uid"))) \
                or (isinstance(ds, str) and is_ds_ref(ds))
            if not ok:
                fail(f"{dash_path}: {where}.datasource is {ds!r}, not the ${{datasource}} variable")
        if "expr" in node:
            exprs.append((where, node["expr"]))
    for name, var in variables.items():
        if var.get("type") == "query":
            q = var.get("query")
            q = q.get("query", "") if isinstance(q, dict) else (q or "")
            m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*\w+\s*\)\s*", q)
            if m:
                exprs.append((f"variable {name}", m.group(1)))
            elif q.strip():
                exprs.append((f"variable {name}", q))

    panels = [n for _, n in walk(dash) if "gridPos" in n and n.get("type") != "row"]
    if not panels:
        fail(f"{dash_path}: no panels")
    for p in panels:
        if not p.get("targets"):
            fail(f"{dash_path}: panel {p.get('title')!r} has no query")
    ids = [n["id"] for _, n in walk(dash) if "gridPos" in n]
    if len(ids) != len(set(ids)):
        fail(f"{dash_path}: duplicate panel ids")

    for where, expr in exprs:
        if where.startswith("variable"):
            pass
        elif not all(m in expr for m in ('job="$job"', 'namespace=~"$namespace"', 'release=~"$release"')):
            fail(f"{dash_path}: {where}: {expr!r} does not select $job, $namespace and $release")
        names = metric_names(expr)
        if not names:
            fail(f"{dash_path}: {where}: no metric in {expr!r}")
        for n in names:
            if n not in known:
                fail(f"{dash_path}: {where}: {n!r} is neither a DESIGN.md metric nor a recording rule")
    if promtool:
        check_parses(promtool, [e for _, e in exprs], dash_path)
    print(f"{dash_path}: {len(panels)} panels, {len(exprs)} expressions checked")


def check_parses(promtool, exprs, label):
    """Lets promtool parse every expression (template variables filled in)."""
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, e in enumerate(exprs):
        e = re.sub(r"\$\{?__\w+\}?", "5m", e)
        e = re.sub(r"\$\{?\w+\}?", "x", e)
        lines += [f"      - record: dashboard_expr_{i}", f"        expr: {json.dumps(e)}"]
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        r = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{label}: promtool cannot parse a dashboard expression:\n{r.stdout}{r.stderr}")


def github_slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def heading_slugs(md_path):
    text = re.sub(r"^```.*?^```", "", read(md_path), flags=re.M | re.S)
    return {github_slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def alert_blocks(alerts_path):
    """{alert name: its rule text}, relying on one `- alert:` per rule."""
    text = read(alerts_path)
    parts = re.split(r"^\s*- alert:\s*", text, flags=re.M)[1:]
    blocks = {}
    for part in parts:
        name, _, body = part.partition("\n")
        body = re.split(r"^\s*- (?:alert|record):|^\s*- name:", body, flags=re.M)[0]
        blocks[name.strip()] = body
    return blocks


def check_alerts(alerts_path, runbooks_path, test_paths):
    blocks = alert_blocks(alerts_path)
    if not blocks:
        fail(f"{alerts_path}: no alerts")
    slugs = heading_slugs(runbooks_path)
    for name, body in blocks.items():
        for key in ("expr", "for", "severity", "summary", "description", "runbook_url"):
            if not re.search(rf"^\s*{key}:", body, re.M):
                fail(f"{alerts_path}: {name} has no {key}")
        sev = re.search(r"^\s*severity:\s*(\S+)", body, re.M)
        if sev and sev.group(1) not in ("critical", "warning", "info"):
            fail(f"{alerts_path}: {name} has severity {sev.group(1)}")
        for url in re.findall(r"runbook_url:\s*\"?([^\"\s]+)", body):
            if not url.startswith(RUNBOOK_PREFIX):
                fail(f"{alerts_path}: {name}: runbook_url {url} does not start with {RUNBOOK_PREFIX}")
            elif url[len(RUNBOOK_PREFIX):] not in slugs:
                fail(f"{alerts_path}: {name}: anchor #{url[len(RUNBOOK_PREFIX):]} is not a heading of "
                     f"{runbooks_path}")

    silent, firing = set(), set()
    for path in test_paths:
        lines = read(path).splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\s*alertname:\s*(\S+)", line)
            if not m:
                continue
            case = []
            for nxt in lines[i + 1:]:
                if re.match(r"\s*- eval_time:", nxt) or re.match(r"\s{0,4}- name:", nxt):
                    break
                case.append(nxt)
            case = "\n".join(case)
            if re.search(r"exp_alerts:\s*\[\s*\]", case):
                silent.add(m.group(1))
            elif all(re.search(rf"^\s*(?:-\s+)?{k}:", case, re.M)
                     for k in ("exp_labels", "severity", "exp_annotations", "summary",
                               "description", "runbook_url")):
                firing.add(m.group(1))
    for name in blocks:
        if name not in silent:
            fail(f"no unit test expects {name} to be silent")
        if name not in firing:
            fail(f"no unit test expects {name} to fire with its labels and annotations")
    print(f"{alerts_path}: {len(blocks)} alerts checked against {runbooks_path} and {len(test_paths)} test files")


def check_docs(metrics_path, runbooks_path, alerts_path, recording_path, design_path):
    check_design(design_path)
    metrics_slugs = heading_slugs(metrics_path)
    metrics_text = read(metrics_path)
    for name in DESIGN_METRICS:
        if github_slug(name) not in metrics_slugs and github_slug(f"`{name}`") not in metrics_slugs:
            fail(f"{metrics_path}: no section (heading) for {name}")
    for name in alert_blocks(alerts_path):
        if name not in metrics_text:
            fail(f"{metrics_path}: alert {name} is not mentioned")
        if github_slug(name) not in heading_slugs(runbooks_path):
            fail(f"{runbooks_path}: no section for alert {name}")
    for name in recorded_names(recording_path):
        if name not in metrics_text:
            fail(f"{metrics_path}: recording rule {name} is not documented")
    print(f"{metrics_path}, {runbooks_path}: checked")


def option(args, flag):
    if flag in args:
        i = args.index(flag)
        value = args[i + 1]
        del args[i:i + 2]
        return value
    return None


def main(argv):
    args = argv[1:]
    design = option(args, "--design")
    promtool = option(args, "--promtool")
    if len(args) >= 3 and args[0] == "dashboard":
        check_dashboard(args[1], args[2], design, promtool)
    elif len(args) >= 4 and args[0] == "alerts":
        check_alerts(args[1], args[2], args[3:])
    elif len(args) == 5 and args[0] == "docs":
        check_docs(args[1], args[2], args[3], args[4], design)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for e in errors:
        print("FAIL: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
