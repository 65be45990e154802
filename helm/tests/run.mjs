// Entry point of the chart tests (one ctest test per command):
//   node run.mjs lint             helm lint --strict, defaults and every values file
//   node run.mjs render CASE      helm template with a values file, API-schema
//                                 validation and assertions (cases.mjs)
//   node run.mjs refusals         invalid values are rejected with a clear message
//   node run.mjs monitoring       the chart's rules/dashboards are monitoring/'s,
//                                 also once packaged
//   node run.mjs test-pod         the helm test pod's check against a live HTTP server
//   node run.mjs values-table     README's values table matches values.yaml
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { cases } from "./cases.mjs";
import { commonChecks, dashboardsIdentical, rulesIdentical } from "./checks.mjs";
import {
  assert, assertEqual, byKind, chartDir, chartSrc, check, failures, finish, helm, monitoringLinks,
  monitoringPresent, one, render, repoRoot, template, tempDir, testsDir, valuesArgs, YAML,
} from "./lib.mjs";
import { refusals } from "./refusals.mjs";
import { valuesTable } from "./values-table.mjs";

const SKIP = 77; // ctest SKIP_RETURN_CODE

const commands = {
  lint() {
    const chart = chartDir();
    const runs = [["defaults", []], ...Object.entries(cases).filter(([n]) => n !== "defaults").map(([n, c]) => [n, c.values])];
    for (const [name, values] of runs) {
      check(`helm lint --strict (${name})`, () => {
        const r = helm(["lint", "--strict", chart, ...valuesArgs(values)]);
        assert(r.status === 0, `${r.stdout}\n${r.stderr}`);
        assert(!/\[(WARNING|ERROR)\]/.test(r.stdout), r.stdout);
      });
    }
  },

  render(name) {
    const c = cases[name];
    assert(c, `unknown case ${name}; known: ${Object.keys(cases).join(", ")}`);
    let objs;
    check(`${name}: helm template renders`, () => {
      objs = render(c.values);
    });
    if (!objs) return;
    commonChecks(name, objs, { secrets: c.secrets || [], runbookBaseUrl: c.runbookBaseUrl || "" });
    c.checks(objs, name);
  },

  refusals() {
    for (const r of refusals) {
      check(`refused: ${r.name}`, () => {
        const out = template(r.values);
        assert(out.status !== 0, `rendered although invalid (${JSON.stringify(r.values)})`);
        assert(r.message.test(out.stderr), `unclear message; expected ${r.message}, got:\n${out.stderr}`);
        assert(!/goroutine|panic:/.test(out.stderr), `helm crashed:\n${out.stderr}`);
      });
    }
    check("accepted: more replicas than partitions once allowIdleConsumers is set", () => {
      render([{ kafka: { requestsPartitions: 2, allowIdleConsumers: true }, autoscaling: { maxReplicas: 4, keda: { enabled: true } } }]);
      render([{ kafka: { requestsPartitions: 2, allowIdleConsumers: true }, worker: { replicaCount: 3 } }]);
    });
    check("accepted: certificate paths in extraVolumeMounts, a file mounted by subPath at its own path included", () => {
      render([{
        extraVolumes: [{ name: "pg-ca", secret: { secretName: "ledger-ca" } }, { name: "kafka-client", secret: { secretName: "sagapool" } }],
        extraVolumeMounts: [
          { name: "pg-ca", mountPath: "/etc/pg/root.crt", subPath: "ca.crt", readOnly: true },
          { name: "kafka-client", mountPath: "/etc/sagapool/kafka-client/", readOnly: true },
        ],
        kafka: { securityProtocol: "SSL", options: { "ssl.key.location": "/etc/sagapool/kafka-client/user.key" } },
        stores: [{ url: "postgresql://sagapool@db/ledger?sslmode=verify-full&sslrootcert=/etc/pg/root.crt", passwordSecret: { name: "p" } }],
      }]);
    });
    check("accepted: every values file in helm/tests/values and the chart's own values.yaml", () => {
      for (const f of fs.readdirSync(path.join(testsDir, "values"))) render([f]);
      render([path.join(chartSrc, "values.yaml")]);
    });
  },

  monitoring() {
    check("files/rules and files/dashboards are symlinks to monitoring/rules and monitoring/dashboards", () => {
      for (const l of monitoringLinks) {
        const link = path.join(chartSrc, "files", l);
        assert(fs.lstatSync(link).isSymbolicLink(), `${link} is not a symlink`);
        assertEqual(fs.readlinkSync(link), `../../../monitoring/${l}`, `${l} link target`);
      }
    });
    if (!monitoringPresent()) {
      console.log("skip: monitoring/rules and monitoring/dashboards are not in the repository yet " +
        "(the render tests use the stand-ins in helm/tests/fixtures/monitoring meanwhile)");
      finish.skip = true;
      return;
    }
    const values = ["prometheus-operator.yaml"];
    const sources = [
      ["the chart directory", chartSrc],
    ];
    check("helm package carries the rule and dashboard files (no symlinks left in the archive)", () => {
      const out = tempDir("package");
      const r = helm(["package", chartSrc, "--destination", out]);
      assert(r.status === 0, r.stderr);
      const tgz = fs.readdirSync(out).find((f) => f.endsWith(".tgz"));
      const list = spawnSync("tar", ["-tvzf", path.join(out, tgz)], { encoding: "utf8" }).stdout;
      for (const f of ["files/rules/alerts.yml", "files/rules/recording.yml", "files/dashboards/sagapool.json"]) {
        assert(list.includes(`sagapool/${f}`), `${f} missing from the package`);
      }
      assert(!/^l/m.test(list), "the package holds symlinks");
      sources.push(["the packaged chart", path.join(out, tgz)]);
    });
    for (const [what, chart] of sources) {
      check(`rules and dashboards rendered from ${what} are exactly monitoring/'s`, () => {
        // The project's own runbook links, so the rules are the files' bytes.
        const objs = render([...values, { metrics: { prometheusRule: { runbookBaseUrl: "" } } }], [], chart);
        const rules = byKind(objs, "PrometheusRule");
        assertEqual(rules.length, 2, "PrometheusRules");
        for (const pr of rules) rulesIdentical(pr);
        // and against monitoring/ directly, not only through the symlink
        for (const pr of rules) {
          const f = path.join(repoRoot, pr.metadata.annotations["sagapool.io/source"]);
          assertEqual(pr.spec.groups, YAML.parse(fs.readFileSync(f, "utf8")).groups, `${f}`);
        }
        dashboardsIdentical(byKind(objs, "ConfigMap").find((c) => c.metadata.name.endsWith("-dashboards")));
      });
    }
  },

  async "test-pod"() {
    const objs = render([]);
    const pod = one(objs, "Pod");
    const c = pod.spec.containers[0];
    assertEqual(c.command.slice(0, 2), ["bash", "-c"], "test pod command");
    const script = c.command[2];
    check("the test pod's script has no $(...) that Kubernetes would expand or $$ it would fold", () => {
      const names = new Set((c.env || []).map((e) => e.name));
      for (const m of script.matchAll(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
        assert(!names.has(m[1]), `$(${m[1]}) would be expanded by Kubernetes`);
      }
      assert(!script.includes("$$"), "$$ would be folded to $ by Kubernetes");
    });
    const serve = (ready) => new Promise((resolve) => {
      const s = http.createServer((req, res) => {
        if (req.url === "/readyz") { res.writeHead(ready ? 200 : 503); res.end(ready ? "ok\n" : "draining\n"); }
        else if (req.url === "/metrics") { res.writeHead(200); res.end('# TYPE saga_build_info gauge\nsaga_build_info{version="0.1.0"} 1\n'); }
        else { res.writeHead(404); res.end(); }
      });
      s.listen(0, "127.0.0.1", () => resolve(s));
    });
    const runScript = (port) => new Promise((resolve) => {
      const env = { ...process.env, TARGET_HOST: "127.0.0.1", TARGET_PORT: String(port), ATTEMPTS: "2", PAUSE: "0.1" };
      const p = spawn("bash", ["-c", script], { env });
      let out = "";
      p.stdout.on("data", (d) => (out += d));
      p.stderr.on("data", (d) => (out += d));
      p.on("close", (code) => resolve({ code, out }));
    });
    for (const ready of [true, false]) {
      const s = await serve(ready);
      const r = await runScript(s.address().port);
      s.close();
      check(`the test pod's check ${ready ? "passes against a ready worker" : "fails against an unready worker"}`, () => {
        if (ready) assert(r.code === 0 && /ok: GET \/metrics/.test(r.out), r.out);
        else assert(r.code !== 0 && /FAILED: GET .*\/readyz/.test(r.out), r.out);
      });
    }
    check("the test pod targets the metrics Service and port", () => {
      const svc = one(objs, "Service");
      const env = Object.fromEntries(c.env.map((e) => [e.name, e.value]));
      assertEqual(env.TARGET_HOST, `${svc.metadata.name}.payments.svc`, "TARGET_HOST");
      assertEqual(env.TARGET_PORT, String(svc.spec.ports[0].port), "TARGET_PORT");
    });
  },

  "values-table"() {
    check("README.md's values table is generated from values.yaml (node helm/tests/values-table.mjs --write)", () => {
      const readme = fs.readFileSync(path.join(chartSrc, "README.md"), "utf8");
      const m = /<!-- values-table:start -->\n([\s\S]*?)<!-- values-table:end -->/.exec(readme);
      assert(m, "README.md has no values-table markers");
      assert(m[1] === valuesTable(), "the table is stale: run node helm/tests/values-table.mjs --write");
    });
    check("every value in values.yaml is described and in the schema", () => {
      const schema = JSON.parse(fs.readFileSync(path.join(chartSrc, "values.schema.json"), "utf8"));
      const rows = valuesTable({ rows: true });
      for (const r of rows) {
        assert(r.description, `${r.key} has no "# --" description`);
        const deref = (n) => (n?.$ref ? deref(schema.definitions[n.$ref.replace("#/definitions/", "")]) : n);
        let node = schema;
        for (const part of r.key.split(".")) {
          node = deref(deref(node).properties?.[part]);
          assert(node, `${r.key} is not in values.schema.json`);
        }
      }
    });
  },
};

const [cmd, ...args] = process.argv.slice(2);
if (!commands[cmd]) {
  console.error(`usage: node run.mjs (${Object.keys(commands).join("|")}) [args]`);
  process.exit(2);
}
try {
  await commands[cmd](...args);
} catch (e) {
  check(`${cmd} ${args.join(" ")}`.trim(), () => { throw e; });
}
if (finish.skip && failures() === 0) {
  console.log("skipped");
  process.exit(SKIP);
}
finish();
