// Values the chart must refuse, and the message that must say why: first
// what values.schema.json rejects, then the combinations the templates
// refuse (values that are each valid but do not fit together).
const store = [{ existingSecret: "ledger" }];

export const refusals = [
  // values.schema.json
  { name: "unknown key", values: [{ worker: { replicas: 3 } }], message: /worker.*replicas.*not allowed/i },
  { name: "unknown top-level key", values: [{ kafkaBrokers: "x:1" }], message: /kafkaBrokers.*not allowed/i },
  { name: "replica count as a string", values: [{ worker: { replicaCount: "two" } }], message: /worker\.replicaCount.*(integer)/i },
  { name: "log format", values: [{ worker: { logFormat: "xml" } }], message: /worker\.logFormat.*"json", "text"/ },
  { name: "drain timeout not a duration", values: [{ worker: { drainTimeout: "20 seconds" } }], message: /worker\.drainTimeout.*pattern/i },
  { name: "lease not a duration", values: [{ worker: { lease: 30 } }], message: /worker\.lease.*string/i },
  { name: "no store", values: [{ stores: [] }], message: /stores.*at least 1/i },
  { name: "store of unknown scheme", values: [{ stores: [{ url: "mysql://db/ledger" }] }], message: /stores\.0\.url.*pattern/i },
  { name: "store with unknown key", values: [{ stores: [{ existingSecret: "s", password: "x" }] }], message: /stores\.0.*password.*not allowed/i },
  { name: "empty brokers", values: [{ kafka: { brokers: "" } }], message: /kafka\.brokers/ },
  { name: "brokers without port", values: [{ kafka: { brokers: "kafka" } }], message: /kafka\.brokers.*pattern/i },
  { name: "SASL mechanism", values: [{ kafka: { sasl: { mechanism: "GSSAPI" } } }], message: /kafka\.sasl\.mechanism.*one of/i },
  { name: "runbook base not a URL", values: [{ metrics: { prometheusRule: { runbookBaseUrl: "our wiki" } } }], message: /metrics\.prometheusRule\.runbookBaseUrl.*pattern/i },
  { name: "privileged metrics port", values: [{ metrics: { port: 80 } }], message: /metrics\.port.*1024/ },
  { name: "root uid", values: [{ securityContext: { runAsUser: 0 } }], message: /securityContext\.runAsUser.*1/ },
  { name: "image digest", values: [{ image: { digest: "latest" } }], message: /image\.digest.*pattern/i },
  { name: "resources with unknown resource", values: [{ worker: { resources: { limits: { gpu: 1 } } } }], message: /gpu.*not allowed/i },
  { name: "Kafka option of bad name", values: [{ kafka: { options: { "Bad Key": "1" } } }], message: /kafka\.options.*(pattern|property name)/i },
  { name: "negative partitions", values: [{ kafka: { requestsPartitions: 0 } }], message: /kafka\.requestsPartitions.*1/ },

  // templates: values that do not fit together
  {
    name: "HPA and KEDA together",
    values: [{ kafka: { requestsPartitions: 6 }, autoscaling: { hpa: { enabled: true }, keda: { enabled: true } } }],
    message: /autoscaling\.hpa\.enabled and autoscaling\.keda\.enabled are both true: enable one autoscaler only/,
  },
  {
    name: "autoscaling without the partition count",
    values: [{ autoscaling: { keda: { enabled: true } } }],
    message: /kafka\.requestsPartitions is not set/,
  },
  {
    name: "maxReplicas above the partition count",
    values: [{ kafka: { requestsPartitions: 4 }, autoscaling: { maxReplicas: 8, hpa: { enabled: true } } }],
    message: /autoscaling\.maxReplicas \(8\) is above kafka\.requestsPartitions \(4\).*allowIdleConsumers/,
  },
  {
    name: "replicaCount above the partition count",
    values: [{ kafka: { requestsPartitions: 4 }, worker: { replicaCount: 5 } }],
    message: /worker\.replicaCount \(5\) is above kafka\.requestsPartitions \(4\)/,
  },
  {
    name: "HPA down to zero",
    values: [{ kafka: { requestsPartitions: 4 }, autoscaling: { minReplicas: 0, maxReplicas: 4, hpa: { enabled: true } } }],
    message: /minReplicas is 0, which an HPA cannot do/,
  },
  {
    name: "minReplicas above maxReplicas",
    values: [{ kafka: { requestsPartitions: 4 }, autoscaling: { minReplicas: 4, maxReplicas: 2, keda: { enabled: true } } }],
    message: /minReplicas \(4\) is above autoscaling\.maxReplicas \(2\)/,
  },
  {
    name: "grace period not above the drain deadline",
    values: [{ worker: { drainTimeout: "1m", terminationGracePeriodSeconds: 60 } }],
    message: /terminationGracePeriodSeconds \(60\) must be above worker\.drainTimeout \(1m = 60s\)/,
  },
  {
    name: "credential in kafka.options",
    values: [{ kafka: { options: { "sasl.password": "hunter2" } } }],
    message: /kafka\.options\.sasl\.password looks like a credential/,
  },
  {
    name: "offset commits taken from the worker",
    values: [{ kafka: { options: { "enable.auto.offset.store": "true" } } }],
    message: /kafka\.options\.enable\.auto\.offset\.store is refused/,
  },
  {
    name: "security.protocol through kafka.options",
    values: [{ kafka: { options: { "security.protocol": "SSL" } } }],
    message: /use kafka\.securityProtocol/,
  },
  {
    name: "SASL without credentials",
    values: [{ kafka: { sasl: { enabled: true } } }],
    message: /kafka\.sasl\.enabled is true but there are no credentials/,
  },
  {
    name: "SASL credentials while SASL is off",
    values: [{ kafka: { sasl: { password: "x" } } }],
    message: /kafka\.sasl credentials are set but kafka\.sasl\.enabled is false/,
  },
  {
    name: "store with both a Secret and a URL",
    values: [{ stores: [{ existingSecret: "ledger", url: "postgresql://db/ledger" }] }],
    message: /stores\[0\] has existingSecret and also url/,
  },
  {
    name: "store with a password in the URL and a password Secret",
    values: [{ stores: [...store, { url: "postgresql://u:pw@db/ledger", passwordSecret: { name: "p" } }] }],
    message: /stores\[1\]\.url carries a password/,
  },
  {
    name: "password Secret for an SQLite store",
    values: [{ stores: [{ url: "sqlite:/tmp/ledger.db", passwordSecret: { name: "p" } }] }],
    message: /stores\[0\]\.passwordSecret needs a postgresql:\/\/ URL/,
  },
  {
    name: "existingSecretKey alone",
    values: [{ stores: [{ existingSecretKey: "uri", url: "postgresql://db/x" }] }],
    message: /stores\[0\]\.existingSecretKey is set without/,
  },
  {
    name: "ServiceMonitor without the metrics Service",
    values: [{ metrics: { service: { enabled: false }, serviceMonitor: { enabled: true } }, tests: { enabled: false } }],
    message: /metrics\.serviceMonitor\.enabled needs metrics\.service\.enabled/,
  },
];
