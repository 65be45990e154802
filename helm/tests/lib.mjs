// Shared machinery of the chart tests: find the tools, stage the chart, run
// helm, parse its output, validate every object against the Kubernetes API
// schemas, and the assertions every rendering must pass.
//
// Tools come from .tools/ (helm/tests/ensure-tools.sh); CMake passes their
// paths in SAGA_HELM and SAGA_NODE_MODULES.
import { execFileSync, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const testsDir = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(testsDir, "../..");
export const chartSrc = path.join(repoRoot, "helm/sagapool");
const toolsDir = path.join(repoRoot, ".tools");
export const helmBin = process.env.SAGA_HELM || path.join(toolsDir, "bin/helm");
const nodeModules = process.env.SAGA_NODE_MODULES || path.join(toolsDir, "node/node_modules");

for (const [what, p] of [["helm", helmBin], ["validators", nodeModules]]) {
  if (!fs.existsSync(p)) {
    console.error(`${what} not found at ${p}: run helm/tests/ensure-tools.sh`);
    process.exit(1);
  }
}
const requireTool = createRequire(path.join(nodeModules, "noop.js"));
export const YAML = requireTool("yaml");

// ---------------------------------------------------------------- results

let passed = 0;
let failed = 0;
export function check(name, fn) {
  try {
    fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}\n     ${String(e.message || e).split("\n").join("\n     ")}`);
  }
}
export const failures = () => failed;
export function finish() {
  console.log(`${passed} passed, ${failed} failed`);
  cleanup();
  process.exit(failed === 0 && passed > 0 ? 0 : 1);
}
export function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}
export function assertEqual(actual, expected, msg) {
  const a = JSON.stringify(actual);
  const b = JSON.stringify(expected);
  if (a !== b) throw new Error(`${msg}\n  got:      ${a}\n  expected: ${b}`);
}

// ---------------------------------------------------------------- scratch

const scratch = [];
export function tempDir(tag) {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), `sagapool-helm-${tag}-`));
  scratch.push(d);
  return d;
}
function cleanup() {
  for (const d of scratch) fs.rmSync(d, { recursive: true, force: true });
}
process.on("exit", cleanup);

// ---------------------------------------------------------------- the chart

// The chart reads the monitoring rules and dashboards through the symlinks
// files/rules and files/dashboards (-> monitoring/). Both must exist for
// Helm to load the chart at all.
export const monitoringLinks = ["rules", "dashboards"];
export function monitoringPresent() {
  return monitoringLinks.every((l) => fs.existsSync(path.join(chartSrc, "files", l)));
}

// The chart directory to test. With monitoring/ in place that is the chart
// itself. Until it lands, a copy in which each dangling link is replaced by
// the stand-ins in helm/tests/fixtures/monitoring.
let staged;
export function chartDir() {
  if (staged) return staged;
  if (monitoringPresent()) return (staged = chartSrc);
  const dir = path.join(tempDir("chart"), "sagapool");
  fs.cpSync(chartSrc, dir, { recursive: true, verbatimSymlinks: true });
  for (const l of monitoringLinks) {
    const link = path.join(dir, "files", l);
    const real = path.join(chartSrc, "files", l);
    fs.rmSync(link, { force: true, recursive: true });
    if (fs.existsSync(real)) fs.symlinkSync(fs.realpathSync(real), link);
    else fs.cpSync(path.join(testsDir, "fixtures/monitoring", l), link, { recursive: true });
  }
  console.log("note: monitoring/rules or monitoring/dashboards is not in the repository yet; " +
    "testing a copy of the chart with the stand-ins of helm/tests/fixtures/monitoring");
  return (staged = dir);
}

// ---------------------------------------------------------------- helm

const helmHome = tempDir("home");
const helmEnv = {
  ...process.env,
  HELM_CACHE_HOME: path.join(helmHome, "cache"),
  HELM_CONFIG_HOME: path.join(helmHome, "config"),
  HELM_DATA_HOME: path.join(helmHome, "data"),
  KUBECONFIG: path.join(helmHome, "no-cluster"),
};

export function helm(args, { cwd } = {}) {
  const r = spawnSync(helmBin, args, { cwd, env: helmEnv, encoding: "utf8", maxBuffer: 64 << 20 });
  // Helm reports each followed symlink on stderr; that is expected here.
  const stderr = (r.stderr || "")
    .split("\n")
    .filter((l) => !/found symbolic link in path/.test(l))
    .join("\n")
    .trim();
  return { status: r.status, stdout: r.stdout || "", stderr };
}

// Values given as objects are written to temporary files (JSON is YAML).
export function valuesArgs(values) {
  const args = [];
  for (const v of values || []) {
    if (typeof v === "string") {
      args.push("-f", path.isAbsolute(v) ? v : path.join(testsDir, "values", v));
    } else {
      const f = path.join(tempDir("values"), "values.json");
      fs.writeFileSync(f, JSON.stringify(v));
      args.push("-f", f);
    }
  }
  return args;
}

export const release = { name: "pay", namespace: "payments" };

export function template(values, extra = [], chart = chartDir()) {
  return helm(["template", release.name, chart, "--namespace", release.namespace,
    ...valuesArgs(values), ...extra]);
}

export function render(values, extra = [], chart) {
  const r = template(values, extra, chart);
  if (r.status !== 0) throw new Error(`helm template failed:\n${r.stderr}`);
  return parseManifests(r.stdout);
}

// Every document of a helm template output, with the template it came from.
export function parseManifests(text) {
  const objects = [];
  for (const doc of YAML.parseAllDocuments(text, { uniqueKeys: true })) {
    if (doc.errors.length) throw new Error(`rendered YAML does not parse: ${doc.errors[0].message}`);
    const obj = doc.toJS({ maxAliasCount: 0 });
    if (obj === null || obj === undefined) continue;
    const source = /# Source: (\S+)/.exec(String(doc))?.[1] ?? "?";
    Object.defineProperty(obj, "__source", { value: source, enumerable: false });
    Object.defineProperty(obj, "__text", { value: String(doc), enumerable: false });
    objects.push(obj);
  }
  return objects;
}

export const byKind = (objs, kind) => objs.filter((o) => o.kind === kind);
export const one = (objs, kind, pred = () => true) => {
  const found = objs.filter((o) => o.kind === kind && pred(o));
  assert(found.length === 1, `expected exactly one ${kind}, found ${found.length}`);
  return found[0];
};
export const sha256 = (s) => createHash("sha256").update(s).digest("hex");

// NOTES.txt as `helm install` would print it: helm template does not render
// it, so a copy of the chart gets it as a named template that a probe
// ConfigMap includes.
export function renderNotes(values) {
  const dir = path.join(tempDir("notes"), "sagapool");
  fs.cpSync(chartDir(), dir, { recursive: true, dereference: true });
  const notes = fs.readFileSync(path.join(dir, "templates/NOTES.txt"), "utf8");
  fs.rmSync(path.join(dir, "templates/NOTES.txt"));
  fs.writeFileSync(path.join(dir, "templates/_notes_probe.tpl"),
    `{{- define "sagapool.test.notes" -}}\n${notes}{{- end }}\n`);
  fs.writeFileSync(path.join(dir, "templates/notes-probe.yaml"),
    'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-probe\ndata:\n' +
    '  notes: {{ include "sagapool.test.notes" . | toJson }}\n');
  const objs = render(values, ["--show-only", "templates/notes-probe.yaml"], dir);
  return objs[0].data.notes;
}

// ---------------------------------------------------------------- API schemas

const models = {
  "v1": (k) => `kubernetes-models/v1/${k}`,
  "apps/v1": (k) => `kubernetes-models/apps/v1/${k}`,
  "batch/v1": (k) => `kubernetes-models/batch/v1/${k}`,
  "policy/v1": (k) => `kubernetes-models/policy/v1/${k}`,
  "autoscaling/v2": (k) => `kubernetes-models/autoscaling/v2/${k}`,
  "networking.k8s.io/v1": (k) => `kubernetes-models/networking.k8s.io/v1/${k}`,
  "monitoring.coreos.com/v1": (k) => `@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/${k}`,
  "keda.sh/v1alpha1": (k) => `@kubernetes-models/keda/keda.sh/v1alpha1/${k}`,
};

function modelFor(obj) {
  const mod = models[obj.apiVersion];
  if (!mod) throw new Error(`no API schema known for apiVersion ${obj.apiVersion} (${obj.kind})`);
  let exported;
  try {
    exported = requireTool(mod(obj.kind));
  } catch {
    throw new Error(`no API schema for ${obj.apiVersion} ${obj.kind}`);
  }
  return exported[obj.kind];
}

// Validates obj against its API schema, like the API server does, and also
// refuses fields the schema does not define (kubectl's --validate=strict):
// the generated validators read exactly the fields their schema knows, so a
// field that no validator read is unknown. Maps (labels, ConfigMap data...)
// are enumerated by their validators and therefore never flagged.
export function validateObject(obj) {
  const Model = modelFor(obj);
  const data = JSON.parse(JSON.stringify(obj));
  const seen = new Map();
  const wrap = (v) => {
    if (v === null || typeof v !== "object") return v;
    if (!seen.has(v)) seen.set(v, { keys: new Set(), enumerated: false });
    const rec = seen.get(v);
    return new Proxy(v, {
      get(t, k, r) {
        if (typeof k === "string") rec.keys.add(k);
        return wrap(Reflect.get(t, k, r));
      },
      has(t, k) {
        if (typeof k === "string") rec.keys.add(k);
        return Reflect.has(t, k);
      },
      ownKeys(t) {
        rec.enumerated = true;
        return Reflect.ownKeys(t);
      },
    });
  };
  try {
    Model.prototype.validate.call(wrap(data));
  } catch (e) {
    throw new Error(`${obj.kind}/${obj.metadata?.name}: ${e.message}`);
  }
  const unknown = [];
  const walk = (v, p) => {
    if (v === null || typeof v !== "object") return;
    const rec = seen.get(v);
    if (Array.isArray(v)) return v.forEach((x, i) => walk(x, `${p}[${i}]`));
    for (const k of Object.keys(v)) {
      if (rec && !rec.enumerated && !rec.keys.has(k)) unknown.push(`${p}.${k}`);
      walk(v[k], `${p}.${k}`);
    }
  };
  walk(data, "");
  if (unknown.length) {
    throw new Error(`${obj.kind}/${obj.metadata?.name}: fields unknown to the API schema: ${unknown.join(", ")}`);
  }
}

// ---------------------------------------------------------------- helpers

export function podSpecOf(obj) {
  if (obj.kind === "Pod") return obj.spec;
  if (obj.kind === "Deployment" || obj.kind === "Job") return obj.spec.template.spec;
  return null;
}
export function podLabelsOf(obj) {
  if (obj.kind === "Pod") return obj.metadata.labels || {};
  return obj.spec.template.metadata?.labels || {};
}
export const selects = (selector, labels) =>
  Object.entries(selector || {}).every(([k, v]) => labels[k] === v) && Object.keys(selector || {}).length > 0;

export function parseDuration(d) {
  const m = /^(\d+)(ms|s|m|h)$/.exec(d);
  assert(m, `not a duration: ${d}`);
  return Number(m[1]) * { ms: 0.001, s: 1, m: 60, h: 3600 }[m[2]];
}

// The worker's config file: the small TOML subset the chart writes
// (key = JSON string | integer | JSON array of strings).
export function parseWorkerToml(text) {
  const out = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-z][a-z-]*) = (.+)$/.exec(line);
    assert(m, `unexpected line in worker.toml: ${line}`);
    assert(!(m[1] in out), `key ${m[1]} twice in worker.toml`);
    out[m[1]] = JSON.parse(m[2]);
  }
  return out;
}

export function b64(s) {
  return Buffer.from(s, "utf8").toString("base64");
}
