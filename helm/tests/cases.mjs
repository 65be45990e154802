// The values files the chart is rendered with, and what each must produce
// beyond the common checks.
import path from "node:path";
import {
  assert, assertEqual, b64, byKind, check, one, parseWorkerToml, podLabelsOf, render, renderNotes, selects,
} from "./lib.mjs";

const kinds = (objs) => new Set(objs.map((o) => o.kind));
function expectKinds(objs, present, absent) {
  const k = kinds(objs);
  for (const p of present) assert(k.has(p), `${p} not rendered`);
  for (const a of absent) assert(!k.has(a), `${a} rendered`);
}
const deployment = (objs) => one(objs, "Deployment");
const workerOf = (objs) => deployment(objs).spec.template.spec.containers.find((c) => c.name === "worker");
const tomlOf = (objs) => parseWorkerToml(byKind(objs, "ConfigMap").find((c) => c.data?.["worker.toml"]).data["worker.toml"]);
const envOf = (objs, name) => (workerOf(objs).env || []).find((e) => e.name === name);
const job = (objs) => one(objs, "Job");
const migrateOf = (objs) => job(objs).spec.template.spec.containers.find((c) => c.name === "migrate");
const isHook = (o) => Boolean(o.metadata.annotations?.["helm.sh/hook"]);

// The Secret key a file path inside a container resolves to, through the
// container's mounts and the pod's secret volumes (the deepest mount wins).
function secretFileAt(podSpec, container, file) {
  const mount = (container.volumeMounts || [])
    .filter((m) => file === m.mountPath || file.startsWith(`${m.mountPath.replace(/\/$/, "")}/`))
    .sort((a, b) => b.mountPath.length - a.mountPath.length)[0];
  assert(mount, `${file} is in no mount of container ${container.name}`);
  const vol = podSpec.volumes.find((v) => v.name === mount.name);
  assert(vol?.secret, `${file} is in volume ${mount.name}, which is not a Secret`);
  const rel = path.posix.join(mount.subPath || "", file.slice(mount.mountPath.length).replace(/^\//, ""));
  const item = vol.secret.items ? vol.secret.items.find((i) => i.path === rel) : { key: rel };
  assert(item, `${file}: Secret ${vol.secret.secretName} projects no ${rel}`);
  return { secret: vol.secret.secretName, key: item.key };
}

export const cases = {
  defaults: {
    values: [],
    checks(objs, name) {
      check(`${name}: the expected objects and no optional ones`, () => {
        expectKinds(objs,
          ["Deployment", "ConfigMap", "Service", "ServiceAccount", "PodDisruptionBudget", "Job", "Pod"],
          ["HorizontalPodAutoscaler", "ScaledObject", "TriggerAuthentication", "ServiceMonitor", "PrometheusRule", "NetworkPolicy", "Secret"]);
        assertEqual(deployment(objs).spec.replicas, 2, "replicas");
        assertEqual(deployment(objs).spec.template.spec.terminationGracePeriodSeconds, 35, "grace = 20s drain + 15s");
        assertEqual(envOf(objs, "SAGA_STORE_0").valueFrom.secretKeyRef, { name: "sagapool-store-0", key: "url" }, "default store Secret");
        assertEqual(envOf(objs, "SAGA_STORE").value, "$(SAGA_STORE_0)", "one store: SAGA_STORE is SAGA_STORE_0");
        assert(!byKind(objs, "ConfigMap").some((c) => c.metadata.name.endsWith("-dashboards")), "dashboards rendered");
      });
      check(`${name}: the pods get no extra volume or envFrom (the pod test models none)`, () => {
        const pod = deployment(objs).spec.template.spec;
        assertEqual(pod.volumes.map((v) => v.name), ["config", "tmp"], "worker volumes");
        assertEqual(workerOf(objs).volumeMounts.map((m) => m.name), ["config", "tmp"], "worker mounts");
        assertEqual(job(objs).spec.template.spec.volumes.map((v) => v.name), ["tmp"], "Job volumes");
        assertEqual(migrateOf(objs).volumeMounts.map((m) => m.name), ["tmp"], "Job mounts");
        for (const c of [workerOf(objs), migrateOf(objs)]) assert(!("envFrom" in c), `${c.name} has envFrom`);
      });
      check(`${name}: the worker configuration`, () => {
        assertEqual(tomlOf(objs), {
          brokers: "kafka:9092", group: "sagapool",
          "requests-topic": "transfers.requests", "results-topic": "transfers.results", "dlq-topic": "transfers.dlq",
          lease: "30s", "metrics-addr": "0.0.0.0:9464", "log-format": "json", "drain-timeout": "20s",
        }, "worker.toml");
      });
      check(`${name}: large numbers from values files keep their digits (Helm reads them as floats)`, () => {
        const big = render([{
          securityContext: { runAsUser: 1000680001, runAsGroup: 0, fsGroup: 1000680001 },
          kafka: { requestsPartitions: 2000000, options: { "fetch.max.bytes": 52428800, "fetch.wait.max.ms": 2.5 } },
          worker: { replicaCount: 1500000, batchSize: 100000 },
          autoscaling: { maxReplicas: 1000000, keda: { enabled: true, lagThreshold: 1000000, cooldownPeriod: 86400 } },
        }]);
        const psc = deployment(big).spec.template.spec.securityContext;
        assertEqual([psc.runAsUser, psc.runAsGroup, psc.fsGroup], [1000680001, 0, 1000680001], "pod ids");
        for (const o of big) {
          const m = /^.*(:|-)\s+-?[0-9]+(\.[0-9]+)?e[+-]?[0-9]+\s*$/m.exec(o.__text);
          assert(!m, `${o.kind}/${o.metadata.name} has a number in exponent notation: ${m?.[0]}`);
        }
        const t = tomlOf(big);
        assertEqual(t["kafka-opt"], ["fetch.max.bytes=52428800", "fetch.wait.max.ms=2.5"], "kafka-opt");
        assertEqual(t["batch-size"], 100000, "batch-size");
        const so = one(big, "ScaledObject");
        assertEqual([so.spec.maxReplicaCount, so.spec.cooldownPeriod, so.spec.triggers[0].metadata.lagThreshold],
          [1000000, 86400, "1000000"], "ScaledObject numbers");
      });
      check(`${name}: checksum/config changes with the configuration and only with it`, () => {
        const sum = (o) => deployment(o).spec.template.metadata.annotations["checksum/config"];
        const base = sum(objs);
        assert(sum(render([{ worker: { lease: "45s" } }])) !== base, "a new lease does not roll the pods");
        assert(sum(render([{ kafka: { options: { "fetch.wait.max.ms": "50" } } }])) !== base, "a new Kafka option does not roll the pods");
        assertEqual(sum(render([{ worker: { replicaCount: 3 } }])), base, "a replica count change rolls the pods");
      });
    },
  },

  keda: {
    values: ["keda.yaml"],
    checks(objs, name) {
      check(`${name}: a ScaledObject on the group's lag, with the workers' SASL credentials`, () => {
        expectKinds(objs, ["ScaledObject", "TriggerAuthentication"], ["HorizontalPodAutoscaler", "Secret"]);
        const so = one(objs, "ScaledObject");
        assertEqual([so.spec.minReplicaCount, so.spec.maxReplicaCount], [0, 12], "replica range");
        const t = so.spec.triggers[0];
        assertEqual(t.type, "kafka", "trigger type");
        assertEqual(t.metadata, {
          bootstrapServers: "kafka-0.kafka:9093,kafka-1.kafka:9093,kafka-2.kafka:9093",
          consumerGroup: "sagapool", topic: "transfers.requests", lagThreshold: "500",
          activationLagThreshold: "0", offsetResetPolicy: "earliest", allowIdleConsumers: "false",
          sasl: "scram_sha512", tls: "enable",
        }, "trigger metadata");
        const ta = one(objs, "TriggerAuthentication");
        assertEqual(t.authenticationRef.name, ta.metadata.name, "authenticationRef");
        assertEqual(ta.spec.secretTargetRef, [
          { parameter: "username", name: "kafka-sagapool-user", key: "username" },
          { parameter: "password", name: "kafka-sagapool-user", key: "password" },
        ], "TriggerAuthentication secrets");
        assert(so.spec.maxReplicaCount <= 12, "maxReplicaCount above the partition count");
      });
      check(`${name}: KEDA's names for the SASL mechanisms`, () => {
        for (const [mechanism, keda] of [["PLAIN", "plaintext"], ["SCRAM-SHA-256", "scram_sha256"], ["SCRAM-SHA-512", "scram_sha512"]]) {
          const so = one(render(["keda.yaml", { kafka: { sasl: { mechanism } } }]), "ScaledObject");
          assertEqual(so.spec.triggers[0].metadata.sasl, keda, `sasl for ${mechanism}`);
        }
      });
      check(`${name}: SASL in the worker configuration and environment`, () => {
        assertEqual(tomlOf(objs)["kafka-opt"], ["security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-512"], "kafka-opt");
        assertEqual(envOf(objs, "SAGA_KAFKA_SASL_PASSWORD").valueFrom.secretKeyRef,
          { name: "kafka-sagapool-user", key: "password" }, "SASL password");
        assertEqual(envOf(objs, "SAGA_STORE_0").valueFrom.secretKeyRef, { name: "ledger-db-app", key: "uri" }, "store Secret");
      });
    },
  },

  hpa: {
    values: ["hpa.yaml"],
    checks(objs, name) {
      check(`${name}: an HPA with the given metrics and no ScaledObject`, () => {
        expectKinds(objs, ["HorizontalPodAutoscaler"], ["ScaledObject", "TriggerAuthentication"]);
        const hpa = one(objs, "HorizontalPodAutoscaler");
        assertEqual([hpa.spec.minReplicas, hpa.spec.maxReplicas], [2, 6], "replica range");
        assertEqual(hpa.spec.metrics.map((m) => m.type), ["Resource", "External"], "metrics");
        assertEqual(hpa.spec.behavior.scaleDown.stabilizationWindowSeconds, 300, "scale-down stabilisation");
        assertEqual(one(objs, "PodDisruptionBudget").spec, {
          minAvailable: "50%", selector: one(objs, "PodDisruptionBudget").spec.selector,
        }, "PDB uses minAvailable only");
      });
    },
  },

  "prometheus-operator": {
    values: ["prometheus-operator.yaml"],
    runbookBaseUrl: "https://wiki.example.com/payments/sagapool/runbooks",
    checks(objs, name) {
      check(`${name}: every alert's runbook_url points at metrics.prometheusRule.runbookBaseUrl`, () => {
        const pr = byKind(objs, "PrometheusRule").find((p) => p.metadata.name.endsWith("-alerts"));
        const alerts = pr.spec.groups.flatMap((g) => g.rules).filter((r) => r.alert);
        assert(alerts.length > 0, "no alerts");
        for (const a of alerts) {
          assertEqual(a.annotations.runbook_url,
            `https://wiki.example.com/payments/sagapool/runbooks#${a.alert.toLowerCase()}`, `${a.alert} runbook_url`);
        }
      });
      check(`${name}: ServiceMonitor, both PrometheusRules, the dashboards and the NetworkPolicy`, () => {
        expectKinds(objs, ["ServiceMonitor", "PrometheusRule", "NetworkPolicy"], []);
        assertEqual(byKind(objs, "PrometheusRule").map((p) => p.metadata.annotations["sagapool.io/source"]).sort(),
          ["monitoring/rules/alerts.yml", "monitoring/rules/recording.yml"], "rule files");
        for (const o of [...byKind(objs, "PrometheusRule"), one(objs, "ServiceMonitor")]) {
          assertEqual(o.metadata.labels.release, "kube-prometheus-stack", `${o.kind} release label`);
        }
        const sm = one(objs, "ServiceMonitor");
        assertEqual(sm.spec.namespaceSelector.matchNames, ["payments"], "ServiceMonitor namespace");
        assertEqual(sm.spec.endpoints[0].interval, "15s", "scrape interval");
        // The alert and recording rules select job="saga-worker"; the
        // dashboard's release variable reads `release`.
        assertEqual(sm.spec.endpoints[0].relabelings[0], { targetLabel: "job", replacement: "saga-worker" },
          "job relabeling");
        assertEqual(sm.spec.endpoints[0].relabelings[1],
          { sourceLabels: ["__meta_kubernetes_service_label_app_kubernetes_io_instance"], targetLabel: "release" },
          "release relabeling");
        const cm = byKind(objs, "ConfigMap").find((c) => c.metadata.name.endsWith("-dashboards"));
        assert(cm, "no dashboards ConfigMap");
        assertEqual([cm.metadata.namespace, cm.metadata.labels.grafana_dashboard, cm.metadata.annotations.grafana_folder],
          ["monitoring", "1", "Payments"], "dashboards namespace, sidecar label, folder");
      });
      check(`${name}: NetworkPolicy admits the metrics port only, from Prometheus and the test pod`, () => {
        const np = one(objs, "NetworkPolicy");
        assertEqual(np.spec.policyTypes, ["Ingress"], "policy types");
        assertEqual(np.spec.ingress.length, 1, "one ingress rule");
        assertEqual(np.spec.ingress[0].ports, [{ port: "metrics", protocol: "TCP" }], "ports");
        const from = np.spec.ingress[0].from;
        assertEqual(from[0].namespaceSelector.matchLabels, { "kubernetes.io/metadata.name": "monitoring" }, "Prometheus peer");
        const testPod = one(objs, "Pod");
        assert(Object.entries(from[1].podSelector.matchLabels).every(([k, v]) => testPod.metadata.labels[k] === v),
          "the test pod is not admitted");
      });
    },
  },

  "external-secrets": {
    values: ["external-secrets.yaml"],
    checks(objs, name) {
      check(`${name}: no chart-made Secret; every credential from the named Secrets`, () => {
        expectKinds(objs, ["Deployment"], ["Secret", "ServiceAccount"]);
        assertEqual(envOf(objs, "SAGA_KAFKA_SASL_USERNAME").valueFrom.secretKeyRef, { name: "sagapool-kafka", key: "user" }, "SASL user");
        assertEqual(envOf(objs, "SAGA_KAFKA_SASL_PASSWORD").valueFrom.secretKeyRef, { name: "sagapool-kafka", key: "pass" }, "SASL password");
        assertEqual(envOf(objs, "SAGA_STORE_0").valueFrom.secretKeyRef, { name: "ledger-0", key: "uri" }, "store 0");
        assertEqual(envOf(objs, "STORE_1_PASSWORD").valueFrom.secretKeyRef, { name: "ledger-1-password", key: "password" }, "store 1 password");
        assertEqual(envOf(objs, "SAGA_STORE_1").value,
          "postgresql://sagapool@ledger-1.db:5432/ledger?sslmode=verify-full&sslrootcert=/etc/sagapool/postgres-ca/ca.crt&password=$(STORE_1_PASSWORD)",
          "store 1 URL");
        assertEqual(secretFileAt(deployment(objs).spec.template.spec, workerOf(objs), "/etc/sagapool/postgres-ca/ca.crt"),
          { secret: "ledger-ca", key: "ca.crt" }, "store 1 sslrootcert");
        assertEqual(deployment(objs).spec.template.spec.serviceAccountName, "payments-workers", "existing ServiceAccount");
      });
      check(`${name}: the Kafka CA is mounted and named in the configuration`, () => {
        const toml = tomlOf(objs);
        assertEqual(toml["kafka-opt"], [
          "security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-256", "ssl.ca.location=/etc/sagapool/kafka-ca/ca.crt",
          "fetch.max.bytes=52428800", "statistics.interval.ms=0",
        ], "kafka-opt");
        const pod = deployment(objs).spec.template.spec;
        const vol = pod.volumes.find((v) => v.secret?.secretName === "my-cluster-cluster-ca-cert");
        assert(vol, "CA Secret not mounted");
        assert(workerOf(objs).volumeMounts.some((m) => m.name === vol.name && m.mountPath === "/etc/sagapool/kafka-ca" && m.readOnly),
          "CA not mounted read-only at /etc/sagapool/kafka-ca");
      });
      check(`${name}: ids left to the platform`, () => {
        const psc = deployment(objs).spec.template.spec.securityContext;
        assertEqual([psc.runAsUser, psc.runAsGroup, psc.fsGroup], [undefined, undefined, undefined], "pod ids");
        assertEqual(workerOf(objs).securityContext.runAsUser, undefined, "container uid");
      });
    },
  },

  "tls-and-egress": {
    values: ["tls-and-egress.yaml"],
    checks(objs, name) {
      // As values/tls-and-egress.yaml gives them. Helm reads values files as
      // YAML 1.1, so defaultMode 0440 arrives as the octal 0o440.
      const extraVolumes = [
        { name: "postgres-ca", secret: { secretName: "ledger-ca", items: [{ key: "ca.crt", path: "ca.crt" }] } },
        { name: "kafka-client", secret: { secretName: "sagapool", defaultMode: 0o440,
          items: [{ key: "user.crt", path: "user.crt" }, { key: "user.key", path: "user.key" }] } },
      ];
      const extraMounts = [
        { name: "postgres-ca", mountPath: "/etc/sagapool/postgres-ca", readOnly: true },
        { name: "kafka-client", mountPath: "/etc/sagapool/kafka-client", readOnly: true },
      ];
      const envFrom = [
        { configMapRef: { name: "sagapool-libpq" } },
        { secretRef: { name: "sagapool-vault", optional: true }, prefix: "VAULT_" },
      ];
      const sorted = (o) => JSON.parse(JSON.stringify(o, (k, v) => (v && typeof v === "object" && !Array.isArray(v)
        ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a.localeCompare(b))) : v)));
      const pods = () => [
        ["worker Deployment", deployment(objs).spec.template.spec, workerOf(objs), ["config", "tmp", "kafka-ca"]],
        ["migration Job", job(objs).spec.template.spec, migrateOf(objs), ["tmp"]],
      ];
      check(`${name}: extraVolumes, extraVolumeMounts and envFrom reach the worker Deployment and the migration Job`, () => {
        for (const [who, spec, c, own] of pods()) {
          assertEqual(spec.volumes.map((v) => v.name), [...own, "postgres-ca", "kafka-client"], `${who} volumes`);
          assertEqual(sorted(spec.volumes.slice(own.length)), sorted(extraVolumes), `${who} extra volumes`);
          assertEqual(c.volumeMounts.map((m) => m.name), [...own, "postgres-ca", "kafka-client"], `${who} mounts`);
          assertEqual(sorted(c.volumeMounts.slice(own.length)), sorted(extraMounts), `${who} extra mounts`);
          assertEqual(sorted(c.envFrom), sorted(envFrom), `${who} envFrom`);
          // The chart's own variables stay (env wins over envFrom in Kubernetes).
          assert(c.env.some((e) => e.name === "SAGA_STORE"), `${who} lost SAGA_STORE`);
        }
      });
      check(`${name}: the helm test pod gets none of them`, () => {
        const pod = one(objs, "Pod");
        assertEqual(pod.spec.volumes.map((v) => v.name), ["tmp"], "test pod volumes");
        assert(!("envFrom" in pod.spec.containers[0]), "test pod has envFrom");
      });
      check(`${name}: PostgreSQL with sslmode=verify-full, its sslrootcert a key of the mounted CA Secret, in both pods`, () => {
        for (const [who, spec, c] of pods()) {
          const url = c.env.find((e) => e.name === "SAGA_STORE_0").value;
          const params = new URLSearchParams(url.slice(url.indexOf("?") + 1));
          assertEqual(params.get("sslmode"), "verify-full", `${who} sslmode`);
          assertEqual(secretFileAt(spec, c, params.get("sslrootcert")), { secret: "ledger-ca", key: "ca.crt" }, `${who} sslrootcert`);
        }
      });
      check(`${name}: Kafka over mTLS, every ssl.*.location a key of a mounted Secret`, () => {
        const opts = tomlOf(objs)["kafka-opt"];
        assertEqual(opts, [
          "security.protocol=SSL", "ssl.ca.location=/etc/sagapool/kafka-ca/ca.crt",
          "ssl.certificate.location=/etc/sagapool/kafka-client/user.crt", "ssl.key.location=/etc/sagapool/kafka-client/user.key",
        ], "kafka-opt");
        const files = Object.fromEntries(opts.filter((o) => /^ssl\.[a-z.]+\.location=/.test(o)).map((o) => o.split("=")));
        const spec = deployment(objs).spec.template.spec;
        assertEqual(secretFileAt(spec, workerOf(objs), files["ssl.ca.location"]), { secret: "my-cluster-cluster-ca-cert", key: "ca.crt" }, "CA");
        assertEqual(secretFileAt(spec, workerOf(objs), files["ssl.certificate.location"]), { secret: "sagapool", key: "user.crt" }, "client certificate");
        assertEqual(secretFileAt(spec, workerOf(objs), files["ssl.key.location"]), { secret: "sagapool", key: "user.key" }, "client key");
      });
      check(`${name}: KEDA reads Kafka with the workers' CA, client certificate and key, from their Secrets`, () => {
        const keda = render(["tls-and-egress.yaml", { kafka: { requestsPartitions: 6 }, autoscaling: { keda: { enabled: true } } }]);
        const so = one(keda, "ScaledObject");
        assertEqual(so.spec.triggers[0].metadata.tls, "enable", "trigger tls");
        const ta = one(keda, "TriggerAuthentication");
        assertEqual(so.spec.triggers[0].authenticationRef.name, ta.metadata.name, "authenticationRef");
        assertEqual(ta.spec.secretTargetRef, [
          { parameter: "ca", name: "my-cluster-cluster-ca-cert", key: "ca.crt" },
          { parameter: "cert", name: "sagapool", key: "user.crt" },
          { parameter: "key", name: "sagapool", key: "user.key" },
        ], "TriggerAuthentication secrets");
      });

      const dnsRule = {
        ports: [{ port: 53, protocol: "UDP" }, { port: 53, protocol: "TCP" }],
        to: [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "kube-system" } },
          podSelector: { matchLabels: { "k8s-app": "kube-dns" } } }],
      };
      const storesRule = { ports: [{ port: 5432, protocol: "TCP" }], to: [{ ipBlock: { cidr: "10.20.0.0/24" } }] };
      const kafkaRule = (ports) => ({
        ports: ports.map((port) => ({ port, protocol: "TCP" })),
        to: [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "kafka" } },
          podSelector: { matchLabels: { "strimzi.io/cluster": "my-cluster", "strimzi.io/kind": "Kafka" } } }],
      });
      const egressPolicies = (o) => byKind(o, "NetworkPolicy").filter((np) => np.spec.policyTypes.includes("Egress"));
      check(`${name}: the workers' egress: DNS, the stores and the brokers, nothing else`, () => {
        const np = one(objs, "NetworkPolicy", (p) => p.spec.policyTypes.includes("Egress") && !isHook(p));
        assertEqual(np.spec.policyTypes, ["Egress"], "policy types");
        assert(selects(np.spec.podSelector.matchLabels, podLabelsOf(deployment(objs))), "does not select the workers");
        assertEqual(sorted(np.spec.egress), sorted([dnsRule, storesRule, kafkaRule([9093])]), "egress rules");
        const ingress = one(objs, "NetworkPolicy", (p) => p.spec.policyTypes.includes("Ingress"));
        assertEqual(ingress.spec.policyTypes, ["Ingress"], "the ingress policy stays ingress only");
      });
      check(`${name}: the migration Job's egress: a hook before the Job, DNS and the stores only`, () => {
        const np = one(objs, "NetworkPolicy", (p) => isHook(p));
        const a = np.metadata.annotations;
        assertEqual(a["helm.sh/hook"], "pre-install,pre-upgrade", "hook");
        assert(Number(a["helm.sh/hook-weight"]) < Number(job(objs).metadata.annotations["helm.sh/hook-weight"]), "not created before the Job");
        assertEqual(np.spec.policyTypes, ["Egress"], "policy types");
        assert(selects(np.spec.podSelector.matchLabels, podLabelsOf(job(objs))), "does not select the Job's pods");
        assert(!selects(np.spec.podSelector.matchLabels, podLabelsOf(deployment(objs))), "selects the workers too");
        assertEqual(sorted(np.spec.egress), sorted([dnsRule, storesRule]), "egress rules");
      });
      check(`${name}: the brokers' ports come from kafka.brokers unless given`, () => {
        const ports = (values) => one(render(["tls-and-egress.yaml", values]), "NetworkPolicy",
          (p) => p.spec.policyTypes.includes("Egress") && !isHook(p)).spec.egress[2];
        assertEqual(ports({ kafka: { brokers: "b-0.kafka:9093,b-1.kafka:9094,b-2.kafka:9093" } }), kafkaRule([9093, 9094]), "from kafka.brokers");
        assertEqual(ports({ networkPolicy: { egress: { kafka: { ports: [9092, 9192] } } } }), kafkaRule([9092, 9192]), "given");
      });
      check(`${name}: an empty dns.to admits the DNS ports anywhere, and OpenShift's 5353 is taken as given`, () => {
        const np = one(render(["tls-and-egress.yaml", { networkPolicy: { egress: { dns: { to: [], ports: [5353] } } } }]), "NetworkPolicy",
          (p) => p.spec.policyTypes.includes("Egress") && !isHook(p));
        assertEqual(np.spec.egress[0], { ports: [{ port: 5353, protocol: "UDP" }, { port: 5353, protocol: "TCP" }] }, "DNS rule");
      });
      check(`${name}: egress policies only when networkPolicy.egress.enabled, the Job's only with the Job`, () => {
        assertEqual(egressPolicies(render(["tls-and-egress.yaml", { networkPolicy: { egress: { enabled: false } } }])).length, 0,
          "egress policies while disabled");
        const noJob = render(["tls-and-egress.yaml", { migrations: { enabled: false } }]);
        assertEqual(egressPolicies(noJob).map((p) => p.metadata.name), ["pay-sagapool-egress"], "without migrations");
        const noIngress = render(["tls-and-egress.yaml", { networkPolicy: { enabled: false } }]);
        assertEqual(egressPolicies(noIngress).length, 2, "egress without the ingress policy");
        assertEqual(byKind(noIngress, "NetworkPolicy").length, 2, "no ingress policy when networkPolicy.enabled is false");
      });
      check(`${name}: NOTES name the Secrets and ConfigMaps the extra volumes and envFrom read`, () => {
        const notes = renderNotes(["tls-and-egress.yaml"]);
        for (const s of ["volume postgres-ca: Secret ledger-ca", "volume kafka-client: Secret sagapool",
          "envFrom: ConfigMap sagapool-libpq", "envFrom: Secret sagapool-vault (optional)"]) {
          assert(notes.includes(s), `NOTES do not say "${s}":\n${notes}`);
        }
      });
    },
  },

  "several-stores": {
    values: ["several-stores.yaml"],
    secrets: ["S3NTINEL-sasl-password", "S3NTINEL-store-0", "S3NTINEL-store-3"],
    checks(objs, name) {
      check(`${name}: four stores in order, each in its form`, () => {
        const w = workerOf(objs);
        assertEqual(w.args, ["--config", "/etc/sagapool/worker.toml"], "args: no store on the command line");
        const names = w.env.map((e) => e.name);
        assertEqual(names.filter((n) => /^(SAGA_)?STORE/.test(n)),
          ["SAGA_STORE_0", "SAGA_STORE_1", "STORE_2_PASSWORD", "SAGA_STORE_2", "SAGA_STORE_3", "SAGA_STORE"], "store variables, in order");
        assertEqual(envOf(objs, "SAGA_STORE").value,
          "$(SAGA_STORE_0)\n$(SAGA_STORE_1)\n$(SAGA_STORE_2)\n$(SAGA_STORE_3)", "SAGA_STORE: the four, one a line");
        const secret = one(objs, "Secret", (s) => !s.metadata.annotations?.["helm.sh/hook"]);
        assertEqual(Object.keys(secret.data).sort(),
          ["kafka-sasl-password", "kafka-sasl-username", "store-0-url", "store-3-url"], "chart Secret keys");
        assertEqual(secret.data["store-3-url"], b64("postgresql://sagapool:S3NTINEL-store-3@ledger-3.db/ledger?sslmode=require"), "store 3 URL");
        assertEqual(envOf(objs, "SAGA_STORE_0").valueFrom.secretKeyRef, { name: secret.metadata.name, key: "store-0-url" }, "store 0");
        assertEqual(envOf(objs, "SAGA_STORE_1").valueFrom.secretKeyRef, { name: "ledger-1", key: "url" }, "store 1");
        assertEqual(envOf(objs, "STORE_2_PASSWORD").valueFrom.secretKeyRef, { name: "ledger-2", key: "password" }, "store 2 password");
        assertEqual(envOf(objs, "SAGA_STORE_3").valueFrom.secretKeyRef, { name: secret.metadata.name, key: "store-3-url" }, "store 3");
        assertEqual(deployment(objs).metadata.annotations["sagapool.io/store-count"], "4", "store-count annotation");
      });
      check(`${name}: the migration Job reads a hook copy of the chart Secret`, () => {
        const hook = one(objs, "Secret", (s) => s.metadata.annotations?.["helm.sh/hook"]);
        const main = one(objs, "Secret", (s) => !s.metadata.annotations?.["helm.sh/hook"]);
        assertEqual(hook.data, main.data, "hook Secret data");
        assertEqual(hook.metadata.annotations["helm.sh/hook-delete-policy"], "before-hook-creation,hook-succeeded", "hook Secret cleanup");
        const env = one(objs, "Job").spec.template.spec.containers[0].env;
        assertEqual(env.find((e) => e.name === "SAGA_STORE_0").valueFrom.secretKeyRef.name, hook.metadata.name, "Job store 0");
      });
      check(`${name}: worker settings from values`, () => {
        const t = tomlOf(objs);
        assertEqual([t["batch-size"], t["drain-timeout"], t["log-format"]], [250, "45s", "text"], "batch, drain, log format");
        assertEqual(deployment(objs).spec.template.spec.terminationGracePeriodSeconds, 60, "grace = 45s + 15s");
        assertEqual(deployment(objs).spec.replicas, 8, "replicas = partitions is allowed");
      });
      check(`${name}: NOTES name the Secrets but print no secret value`, () => {
        const notes = renderNotes(["several-stores.yaml"]);
        assert(/store 1: Secret ledger-1, key url/.test(notes), `NOTES do not name the store Secret:\n${notes}`);
        for (const s of cases["several-stores"].secrets) assert(!notes.includes(s), `NOTES print ${s}`);
        assert(!/postgresql:\/\/[^\s]*@/.test(notes), "NOTES print a store URL");
      });
    },
  },
};
