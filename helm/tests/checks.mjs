// Assertions every rendering of the chart must pass, whatever the values.
import fs from "node:fs";
import path from "node:path";
import {
  assert, assertEqual, b64, byKind, check, chartDir, one, parseDuration, parseWorkerToml,
  podLabelsOf, podSpecOf, selects, validateObject, YAML,
} from "./lib.mjs";

const standardLabels = [
  "helm.sh/chart",
  "app.kubernetes.io/name",
  "app.kubernetes.io/instance",
  "app.kubernetes.io/version",
  "app.kubernetes.io/managed-by",
  "app.kubernetes.io/component",
];

// Things in a rendering that must never be secret: everything but Secrets.
const notSecret = (objs) => objs.filter((o) => o.kind !== "Secret");

export function commonChecks(name, objs, { secrets = [], runbookBaseUrl = "" } = {}) {
  const label = (s) => `${name}: ${s}`;

  check(label(`${objs.length} objects, each valid against its Kubernetes API schema (unknown fields refused)`), () => {
    const errors = [];
    for (const o of objs) {
      try {
        validateObject(o);
      } catch (e) {
        errors.push(`${o.__source}: ${e.message}`);
      }
    }
    assert(errors.length === 0, errors.join("\n"));
  });

  check(label("names are DNS labels of at most 63 characters, standard labels everywhere"), () => {
    for (const o of objs) {
      const n = o.metadata?.name || "";
      assert(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(n) && n.length <= 63, `${o.kind} name ${JSON.stringify(n)}`);
      for (const l of standardLabels) {
        assert(o.metadata.labels?.[l], `${o.kind}/${n} lacks label ${l}`);
      }
      const pl = podSpecOf(o) && podLabelsOf(o);
      if (pl) for (const l of standardLabels) assert(pl[l], `pods of ${o.kind}/${n} lack label ${l}`);
    }
  });

  check(label("not both an HPA and a KEDA ScaledObject"), () => {
    assert(!(byKind(objs, "HorizontalPodAutoscaler").length && byKind(objs, "ScaledObject").length),
      "both an HPA and a ScaledObject are rendered");
  });

  check(label("restricted securityContext on every pod and container, no service-account token"), () => {
    const pods = objs.filter(podSpecOf);
    assert(pods.length > 0, "no pod-bearing object rendered");
    for (const o of pods) restricted(o);
    for (const sa of byKind(objs, "ServiceAccount")) {
      assert(sa.automountServiceAccountToken === false, `ServiceAccount/${sa.metadata.name} mounts its token`);
    }
  });

  check(label("no credential in any ConfigMap, nor anywhere outside Secrets"), () => {
    for (const cm of byKind(objs, "ConfigMap")) {
      for (const [k, v] of Object.entries(cm.data || {})) {
        assert(!/:\/\/[^/\s:@"]+:[^/\s@"]+@/.test(v), `ConfigMap/${cm.metadata.name} ${k} holds a URL with a password`);
        assert(!/password\s*=/i.test(v), `ConfigMap/${cm.metadata.name} ${k} sets a password`);
      }
    }
    for (const s of secrets) {
      for (const o of notSecret(objs)) {
        assert(!o.__text.includes(s), `${o.kind}/${o.metadata.name} contains the secret ${JSON.stringify(s)}`);
      }
    }
  });

  if (secrets.length) {
    check(label("each secret value given in values reaches a Secret (so the check above can fail)"), () => {
      const data = byKind(objs, "Secret").flatMap((s) => Object.values(s.data || {}));
      for (const s of secrets) {
        assert(data.some((d) => Buffer.from(d, "base64").toString("utf8").includes(s)),
          `no Secret carries ${JSON.stringify(s)}`);
      }
    });
  }

  const deploy = one(objs, "Deployment");
  const pod = deploy.spec.template.spec;
  const worker = pod.containers.find((c) => c.name === "worker");
  const config = byKind(objs, "ConfigMap").find((c) => c.data?.["worker.toml"]);
  const toml = config && parseWorkerToml(config.data["worker.toml"]);

  check(label("worker: flags from the config file, probes on /livez and /readyz, grace above the drain deadline"), () => {
    assert(worker, "no worker container");
    assertEqual(worker.command, ["saga-worker"], "worker command");
    assertEqual(worker.args.slice(0, 2), ["--config", "/etc/sagapool/worker.toml"], "worker args start");
    assert(toml, "no ConfigMap with worker.toml");
    const cfgVol = pod.volumes.find((v) => v.configMap?.name === config.metadata.name);
    assert(cfgVol, "the config ConfigMap is not mounted");
    assert(worker.volumeMounts.some((m) => m.name === cfgVol.name && m.mountPath === "/etc/sagapool/worker.toml"),
      "worker.toml not mounted at /etc/sagapool/worker.toml");
    for (const k of ["brokers", "group", "requests-topic", "results-topic", "dlq-topic", "lease", "metrics-addr", "log-format", "drain-timeout"]) {
      assert(k in toml, `worker.toml lacks ${k}`);
    }
    const port = worker.ports.find((p) => p.name === "metrics");
    assert(port, "no metrics port");
    assertEqual(toml["metrics-addr"], `0.0.0.0:${port.containerPort}`, "metrics-addr matches the container port");
    assertEqual(worker.startupProbe.httpGet, { path: "/livez", port: "metrics" }, "startup probe");
    assertEqual(worker.livenessProbe.httpGet, { path: "/livez", port: "metrics" }, "liveness probe");
    assertEqual(worker.readinessProbe.httpGet, { path: "/readyz", port: "metrics" }, "readiness probe");
    const drain = parseDuration(toml["drain-timeout"]);
    assert(pod.terminationGracePeriodSeconds > drain,
      `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} is not above the drain deadline ${drain}s`);
    assert(/^[0-9a-f]{64}$/.test(deploy.spec.template.metadata.annotations?.["checksum/config"] || ""),
      "no checksum/config annotation on the pod template");
    assert(worker.volumeMounts.some((m) => m.mountPath === "/tmp"), "no writable /tmp");
    assert(pod.volumes.some((v) => v.emptyDir && worker.volumeMounts.some((m) => m.name === v.name && m.mountPath === "/tmp")),
      "/tmp is not an emptyDir");
    assert(worker.resources?.requests?.cpu && worker.resources?.requests?.memory && worker.resources?.limits?.memory,
      "worker resources incomplete");
  });

  check(label("stores: SAGA_STORE lists SAGA_STORE_i in order, every one from a Secret"), () => {
    const count = storesFromSecrets(worker, objs, "worker");
    assertEqual(String(count), deploy.metadata.annotations?.["sagapool.io/store-count"], "worker stores vs store-count");
    const job = byKind(objs, "Job")[0];
    if (job) {
      const c = job.spec.template.spec.containers[0];
      assertEqual(c.command, ["sagactl"], "migration command");
      assertEqual(c.args, ["init"], "migration runs init and nothing else");
      assertEqual(storesFromSecrets(c, objs, "migration"), count, "migration uses the worker's stores");
    }
  });

  check(label("no store URL, password or $(SAGA_STORE...) on any container's command line"), () => {
    for (const o of objs.filter(podSpecOf)) {
      const spec = podSpecOf(o);
      for (const c of [...(spec.initContainers || []), ...spec.containers]) {
        for (const a of [...(c.command || []), ...(c.args || [])]) {
          const where = `${o.kind}/${o.metadata.name} container ${c.name} arg ${JSON.stringify(a)}`;
          assert(!/\$\((SAGA_)?STORE/.test(a), `${where} expands a store variable onto the command line`);
          assert(!/(postgres(ql)?:\/\/|sqlite:)/i.test(a), `${where} holds a store URL`);
          assert(!/(^|\s)(password|host|dbname|user)\s*=/i.test(a), `${where} holds a connection string`);
          assert(a !== "--store" && !a.startsWith("--store="), `${where} passes --store`);
        }
      }
    }
  });

  check(label("Kafka SASL credentials only from Secrets"), () => {
    for (const n of ["SAGA_KAFKA_SASL_USERNAME", "SAGA_KAFKA_SASL_PASSWORD"]) {
      const e = (worker.env || []).find((x) => x.name === n);
      if (e) {
        assert(e.valueFrom?.secretKeyRef && e.value === undefined, `${n} is not from a Secret`);
        secretKeyExists(objs, e.valueFrom.secretKeyRef, false);
      }
    }
  });

  check(label("selectors and references line up"), () => {
    const podLabels = podLabelsOf(deploy);
    assert(selects(deploy.spec.selector.matchLabels, podLabels), "Deployment selector misses its pods");
    for (const svc of byKind(objs, "Service")) {
      assert(selects(svc.spec.selector, podLabels), `Service/${svc.metadata.name} misses the workers`);
      for (const p of svc.spec.ports) {
        assert(worker.ports.some((wp) => wp.name === p.targetPort || wp.containerPort === p.targetPort),
          `Service port ${p.name} targets no worker port`);
      }
    }
    for (const sm of byKind(objs, "ServiceMonitor")) {
      const svc = byKind(objs, "Service").find((s) => selects(sm.spec.selector.matchLabels, s.metadata.labels));
      assert(svc, "ServiceMonitor selects no Service");
      for (const ep of sm.spec.endpoints) {
        assert(svc.spec.ports.some((p) => p.name === ep.port), `ServiceMonitor port ${ep.port} not on the Service`);
      }
    }
    for (const pdb of byKind(objs, "PodDisruptionBudget")) {
      assert(selects(pdb.spec.selector.matchLabels, podLabels), "PDB misses the workers");
    }
    // A hook policy is the migration Job's (created before it); the others are the workers'.
    const job = byKind(objs, "Job")[0];
    for (const np of byKind(objs, "NetworkPolicy")) {
      const hook = np.metadata.annotations?.["helm.sh/hook"];
      const [who, labels] = hook ? ["the migration Job", job && podLabelsOf(job)] : ["the workers", podLabels];
      assert(labels && selects(np.spec.podSelector.matchLabels, labels), `NetworkPolicy/${np.metadata.name} misses ${who}`);
    }
    for (const a of [...byKind(objs, "HorizontalPodAutoscaler"), ...byKind(objs, "ScaledObject")]) {
      assertEqual([a.spec.scaleTargetRef.kind ?? "Deployment", a.spec.scaleTargetRef.name],
        ["Deployment", deploy.metadata.name], `${a.kind} target`);
    }
    if (byKind(objs, "HorizontalPodAutoscaler").length || byKind(objs, "ScaledObject").length) {
      assert(deploy.spec.replicas === undefined, "Deployment sets replicas although an autoscaler owns them");
    }
    const sa = pod.serviceAccountName;
    if (byKind(objs, "ServiceAccount").length) {
      assert(byKind(objs, "ServiceAccount").some((s) => s.metadata.name === sa), `ServiceAccount ${sa} not rendered`);
    }
  });

  check(label("every mount names a volume of its pod, no two mounts share a path"), () => {
    for (const o of objs.filter(podSpecOf)) {
      const spec = podSpecOf(o);
      const names = (spec.volumes || []).map((v) => v.name);
      assertEqual(new Set(names).size, names.length, `${o.kind}/${o.metadata.name} volume names are not unique`);
      for (const c of [...(spec.initContainers || []), ...spec.containers]) {
        const paths = (c.volumeMounts || []).map((m) => m.mountPath);
        assertEqual(new Set(paths).size, paths.length, `${o.kind}/${o.metadata.name} container ${c.name} mount paths are not unique`);
        for (const m of c.volumeMounts || []) {
          assert(names.includes(m.name), `${o.kind}/${o.metadata.name} container ${c.name} mounts ${m.name}, which is no volume`);
        }
      }
    }
  });

  check(label("hooks: migrations before install/upgrade, a test pod for helm test"), () => {
    for (const job of byKind(objs, "Job")) {
      const a = job.metadata.annotations || {};
      assertEqual(a["helm.sh/hook"], "pre-install,pre-upgrade", "migration Job hook");
      // A chart Secret a pre-install Job reads must itself be an earlier hook.
      for (const ref of secretRefs(job.spec.template.spec.containers[0])) {
        const s = byKind(objs, "Secret").find((x) => x.metadata.name === ref.name);
        if (!s) continue; // an existing Secret
        assertEqual(s.metadata.annotations?.["helm.sh/hook"], "pre-install,pre-upgrade", `Secret ${ref.name} read by the Job is not a hook`);
        assert(Number(s.metadata.annotations["helm.sh/hook-weight"]) < Number(a["helm.sh/hook-weight"] || 0),
          `Secret ${ref.name} is not created before the Job`);
      }
      // So is a NetworkPolicy that lets the Job out.
      for (const np of byKind(objs, "NetworkPolicy").filter((p) => p.metadata.annotations?.["helm.sh/hook"])) {
        const na = np.metadata.annotations;
        assertEqual(na["helm.sh/hook"], a["helm.sh/hook"], `NetworkPolicy/${np.metadata.name} hook`);
        assert(Number(na["helm.sh/hook-weight"]) < Number(a["helm.sh/hook-weight"] || 0),
          `NetworkPolicy/${np.metadata.name} is not created before the Job`);
      }
    }
    for (const p of byKind(objs, "Pod")) {
      assertEqual(p.metadata.annotations?.["helm.sh/hook"], "test", `Pod/${p.metadata.name} hook`);
    }
  });

  for (const pr of byKind(objs, "PrometheusRule")) {
    check(label(`PrometheusRule ${pr.metadata.name} is exactly ${pr.metadata.annotations["sagapool.io/source"]}`), () => {
      rulesIdentical(pr, runbookBaseUrl);
    });
  }
  for (const cm of byKind(objs, "ConfigMap").filter((c) => c.metadata.name.endsWith("-dashboards"))) {
    check(label("dashboards ConfigMap holds exactly monitoring/dashboards/*.json"), () => dashboardsIdentical(cm));
  }
}

// The file a PrometheusRule came from, as the chart sees it (the symlink
// into monitoring/, or the stand-in while monitoring/ is not there).
export function rulesIdentical(pr, runbookBaseUrl = "") {
  const source = pr.metadata.annotations?.["sagapool.io/source"] || "";
  const m = /^monitoring\/rules\/([a-z]+\.yml)$/.exec(source);
  assert(m, `PrometheusRule ${pr.metadata.name} does not name its source`);
  const file = path.join(chartDir(), "files/rules", m[1]);
  let text = fs.readFileSync(file, "utf8");
  if (runbookBaseUrl) text = text.replaceAll("https://github.com/sagapool/sagapool/blob/main/docs/runbooks.md", runbookBaseUrl);
  const expected = YAML.parse(text);
  assert(Array.isArray(expected?.groups) && expected.groups.length > 0, `${source} has no groups`);
  assertEqual(Object.keys(pr.spec), ["groups"], "PrometheusRule spec keys");
  assertEqual(pr.spec.groups, expected.groups, `rendered groups differ from ${source}`);
}

export function dashboardsIdentical(cm) {
  const dir = path.join(chartDir(), "files/dashboards");
  const files = fs.readdirSync(dir).filter((f) => f.endsWith(".json")).sort();
  assertEqual(Object.keys(cm.data).sort(), files, "dashboard files");
  for (const f of files) {
    assertEqual(JSON.parse(cm.data[f]), JSON.parse(fs.readFileSync(path.join(dir, f), "utf8")), `dashboard ${f}`);
  }
}

// The volume kinds the restricted Pod Security Standard allows.
const restrictedVolumeKinds = ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];

function restricted(o) {
  const where = `${o.kind}/${o.metadata.name}`;
  const spec = podSpecOf(o);
  const psc = spec.securityContext || {};
  assert(psc.runAsNonRoot === true, `${where}: pod runAsNonRoot is not true`);
  assert(psc.runAsUser !== 0, `${where}: pod runs as root`);
  assertEqual(psc.seccompProfile?.type, "RuntimeDefault", `${where}: pod seccomp profile`);
  assert(spec.automountServiceAccountToken === false, `${where}: the service-account token is mounted`);
  for (const f of ["hostNetwork", "hostPID", "hostIPC"]) assert(!spec[f], `${where}: ${f}`);
  for (const v of spec.volumes || []) {
    const kinds = Object.keys(v).filter((k) => k !== "name");
    assert(kinds.length === 1 && restrictedVolumeKinds.includes(kinds[0]),
      `${where}: volume ${v.name} is of kind ${kinds.join("+")}, which the restricted profile does not allow`);
  }
  const containers = [...(spec.initContainers || []), ...spec.containers];
  for (const c of containers) {
    const sc = c.securityContext || {};
    const cw = `${where} container ${c.name}`;
    assert(sc.runAsNonRoot === true, `${cw}: runAsNonRoot is not true`);
    assert(sc.runAsUser !== 0, `${cw}: runs as root`);
    assert(sc.allowPrivilegeEscalation === false, `${cw}: allowPrivilegeEscalation is not false`);
    assert(sc.readOnlyRootFilesystem === true, `${cw}: root filesystem is writable`);
    assert(sc.privileged !== true, `${cw}: privileged`);
    assertEqual(sc.capabilities?.drop, ["ALL"], `${cw}: capabilities.drop`);
    assert(!sc.capabilities?.add?.length, `${cw}: adds capabilities`);
    assertEqual(sc.seccompProfile?.type ?? psc.seccompProfile?.type, "RuntimeDefault", `${cw}: seccomp profile`);
    assert(c.resources?.limits?.memory && c.resources?.requests?.cpu, `${cw}: no resources`);
  }
}

function secretRefs(c) {
  return [
    ...(c.env || []).filter((e) => e.valueFrom?.secretKeyRef).map((e) => e.valueFrom.secretKeyRef),
    ...(c.envFrom || []).filter((e) => e.secretRef).map((e) => e.secretRef),
  ];
}

// A reference to a Secret the chart renders must name a key it holds.
function secretKeyExists(objs, ref, hookOnly) {
  const s = byKind(objs, "Secret").find((x) => x.metadata.name === ref.name);
  if (!s) return; // an existing Secret, outside the chart
  assert(Object.hasOwn(s.data || {}, ref.key), `Secret ${ref.name} has no key ${ref.key}`);
  if (hookOnly) assert(s.metadata.annotations?.["helm.sh/hook"], `Secret ${ref.name} is not a hook`);
}

// The store variables of one container: SAGA_STORE_0..n-1, each from a
// Secret (or a URL without password plus an earlier STORE_i_PASSWORD from a
// Secret), then SAGA_STORE listing them one a line. Returns n.
function storesFromSecrets(c, objs, who) {
  const env = c.env || [];
  const idx = (n) => env.findIndex((e) => e.name === n);
  const numbered = env.filter((e) => /^SAGA_STORE_\d+$/.test(e.name)).map((e) => Number(e.name.slice(11)));
  const count = numbered.length;
  assert(count >= 1, `${who}: no SAGA_STORE_0`);
  assertEqual(numbered, [...Array(count).keys()], `${who}: SAGA_STORE_i names, in order`);
  for (let i = 0; i < count; i++) {
    const e = env[idx(`SAGA_STORE_${i}`)];
    if (e.valueFrom) {
      assert(e.valueFrom.secretKeyRef, `${who}: SAGA_STORE_${i} is not from a Secret`);
      secretKeyExists(objs, e.valueFrom.secretKeyRef);
    } else {
      // URL without password + $(STORE_i_PASSWORD), which must come earlier.
      const refs = [...e.value.matchAll(/\$\(([A-Z0-9_]+)\)/g)].map((m) => m[1]);
      assertEqual(refs, [`STORE_${i}_PASSWORD`], `${who}: SAGA_STORE_${i} value`);
      assert(!/:\/\/[^/@]*:[^/@]*@/.test(e.value), `${who}: SAGA_STORE_${i} carries a password`);
      const p = idx(`STORE_${i}_PASSWORD`);
      assert(p >= 0 && p < idx(`SAGA_STORE_${i}`), `${who}: STORE_${i}_PASSWORD must come before SAGA_STORE_${i}`);
      assert(env[p].valueFrom?.secretKeyRef, `${who}: STORE_${i}_PASSWORD is not from a Secret`);
    }
  }
  // Kubernetes expands $(VAR) only for variables listed earlier.
  const all = env.filter((e) => e.name === "SAGA_STORE");
  assertEqual(all.length, 1, `${who}: SAGA_STORE defined once`);
  const s = all[0];
  assert(s.valueFrom === undefined, `${who}: SAGA_STORE must be a value made of the SAGA_STORE_i`);
  const at = idx("SAGA_STORE");
  for (let i = 0; i < count; i++) {
    assert(idx(`SAGA_STORE_${i}`) < at, `${who}: SAGA_STORE comes before SAGA_STORE_${i}, which it references`);
  }
  assertEqual(s.value, [...Array(count).keys()].map((i) => `$(SAGA_STORE_${i})`).join("\n"),
    `${who}: SAGA_STORE value (the SAGA_STORE_i in order, one a line)`);
  return count;
}

export { b64 };
