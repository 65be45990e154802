// Values the chart must refuse, and the message that must say why: first
// what values.schema.json rejects, then the combinations the templates
// refuse (values that are each valid but do not fit together).
const store = [{ existingSecret: "ledger" }];
const caVolume = { name: "ca", secret: { secretName: "ledger-ca" } };

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
  { name: "extraVolumes as a map", values: [{ extraVolumes: { name: "ca" } }], message: /extraVolumes: Invalid type\. Expected: array/ },
  { name: "extra volume without a name", values: [{ extraVolumes: [{ secret: { secretName: "ca" } }] }], message: /extraVolumes\.0: name is required/ },
  { name: "hostPath extra volume", values: [{ extraVolumes: [{ name: "host", hostPath: { path: "/" } }] }], message: /extraVolumes\.0: Additional property hostPath is not allowed/ },
  {
    name: "extra volume with two sources",
    values: [{ extraVolumes: [{ name: "ca", secret: { secretName: "a" }, configMap: { name: "b" } }] }],
    message: /extraVolumes\.0: Must have at most 2 properties/,
  },
  { name: "extra volume mode as a string", values: [{ extraVolumes: [{ name: "ca", secret: { secretName: "a", defaultMode: "0440" } }] }], message: /extraVolumes\.0\.secret\.defaultMode: Invalid type\. Expected: integer/ },
  { name: "relative mount path", values: [{ extraVolumeMounts: [{ name: "ca", mountPath: "etc/ca" }] }], message: /extraVolumeMounts\.0\.mountPath: Does not match pattern/ },
  { name: "readOnly as a string", values: [{ extraVolumeMounts: [{ name: "ca", mountPath: "/etc/ca", readOnly: "yes" }] }], message: /extraVolumeMounts\.0\.readOnly: Invalid type\. Expected: boolean/ },
  { name: "envFrom as a map", values: [{ envFrom: { secretRef: { name: "env" } } }], message: /envFrom: Invalid type\. Expected: array/ },
  {
    name: "envFrom with both a ConfigMap and a Secret",
    values: [{ envFrom: [{ configMapRef: { name: "a" }, secretRef: { name: "b" } }] }],
    message: /envFrom\.0: Must validate one and only one schema/,
  },
  { name: "envFrom with neither", values: [{ envFrom: [{ prefix: "X_" }] }], message: /envFrom\.0: Must validate one and only one schema/ },
  { name: "envFrom Secret without a name", values: [{ envFrom: [{ secretRef: {} }] }], message: /envFrom\.0\.secretRef: name is required/ },
  { name: "egress switch as a string", values: [{ networkPolicy: { egress: { enabled: "true" } } }], message: /networkPolicy\.egress\.enabled: Invalid type\. Expected: boolean/ },
  { name: "egress port out of range", values: [{ networkPolicy: { egress: { stores: { ports: [70000] } } } }], message: /networkPolicy\.egress\.stores\.ports\.0: Must be less than or equal to 65535/ },
  { name: "egress port as a string", values: [{ networkPolicy: { egress: { kafka: { ports: ["9092"] } } } }], message: /networkPolicy\.egress\.kafka\.ports\.0: Invalid type\. Expected: integer/ },
  { name: "no DNS port", values: [{ networkPolicy: { egress: { dns: { ports: [] } } } }], message: /networkPolicy\.egress\.dns\.ports: Array must have at least 1 items/ },
  {
    name: "egress peer of unknown shape",
    values: [{ networkPolicy: { egress: { stores: { to: [{ ipBlock: { cidr: "10.0.0.0/8" }, ports: [5432] }] } } } }],
    message: /networkPolicy\.egress\.stores\.to\.0: Additional property ports is not allowed/,
  },

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
    name: "extra volume named like one of the chart's",
    values: [{ extraVolumes: [{ name: "tmp", emptyDir: {} }] }],
    message: /extraVolumes\[0\] is named tmp, like a volume of the chart's own/,
  },
  {
    name: "two extra volumes of one name",
    values: [{ extraVolumes: [{ name: "ca", secret: { secretName: "a" } }, { name: "ca", configMap: { name: "b" } }] }],
    message: /extraVolumes\[1\]: the name ca is used twice/,
  },
  {
    name: "mount of a volume not in extraVolumes",
    values: [{ extraVolumes: [caVolume], extraVolumeMounts: [{ name: "kafka-ca", mountPath: "/etc/ca" }] }],
    message: /extraVolumeMounts\[0\] mounts kafka-ca, which is not in extraVolumes/,
  },
  {
    name: "mount hiding the worker's config file",
    values: [{ extraVolumes: [caVolume], extraVolumeMounts: [{ name: "ca", mountPath: "/etc/sagapool" }] }],
    message: /extraVolumeMounts\[0\]\.mountPath \/etc\/sagapool would hide the chart's own \/etc\/sagapool\/worker\.toml/,
  },
  {
    name: "mount hiding the writable /tmp",
    values: [{ extraVolumes: [caVolume], extraVolumeMounts: [{ name: "ca", mountPath: "/tmp/" }] }],
    message: /extraVolumeMounts\[0\]\.mountPath \/tmp\/ would hide the chart's own \/tmp/,
  },
  {
    name: "two mounts at one path",
    values: [{ extraVolumes: [caVolume], extraVolumeMounts: [{ name: "ca", mountPath: "/etc/ca" }, { name: "ca", mountPath: "/etc/ca/" }] }],
    message: /extraVolumeMounts\[1\]\.mountPath \/etc\/ca\/ is used twice/,
  },
  {
    name: "Kafka client key outside every mount",
    values: [{ extraVolumes: [caVolume], extraVolumeMounts: [{ name: "ca", mountPath: "/etc/ca" }], kafka: { options: { "ssl.key.location": "/etc/cab/user.key" } } }],
    message: /kafka\.options\.ssl\.key\.location \(\/etc\/cab\/user\.key\) is in none of extraVolumeMounts/,
  },
  {
    name: "sslrootcert outside every mount",
    values: [{ stores: [{ url: "postgresql://sagapool@db/ledger?sslmode=verify-full&sslrootcert=/etc/pg/ca.crt", passwordSecret: { name: "p" } }] }],
    message: /stores\[0\]\.url: sslrootcert=\/etc\/pg\/ca\.crt is in none of extraVolumeMounts/,
  },
  {
    name: "KEDA with a client certificate but no key",
    values: [{
      extraVolumes: [{ name: "kafka-client", secret: { secretName: "sagapool" } }],
      extraVolumeMounts: [{ name: "kafka-client", mountPath: "/etc/sagapool/kafka-client" }],
      kafka: { requestsPartitions: 6, options: { "ssl.certificate.location": "/etc/sagapool/kafka-client/user.crt" } },
      autoscaling: { keda: { enabled: true } },
    }],
    message: /KEDA needs both kafka\.options ssl\.certificate\.location and ssl\.key\.location, and ssl\.key\.location is missing/,
  },
  {
    name: "KEDA with a client certificate outside a Secret",
    values: [{
      extraVolumes: [{ name: "kafka-client", configMap: { name: "sagapool-certs" } }],
      extraVolumeMounts: [{ name: "kafka-client", mountPath: "/etc/sagapool/kafka-client" }],
      kafka: {
        requestsPartitions: 6,
        options: { "ssl.certificate.location": "/etc/sagapool/kafka-client/user.crt", "ssl.key.location": "/etc/sagapool/kafka-client/user.key" },
      },
      autoscaling: { keda: { enabled: true } },
    }],
    message: /KEDA reads the Kafka client certificate and key from Secrets, but kafka\.options\.ssl\.certificate\.location \(\/etc\/sagapool\/kafka-client\/user\.crt\) is no key of a secret volume/,
  },
  {
    name: "egress without the stores' address",
    values: [{ networkPolicy: { egress: { enabled: true, kafka: { to: [{ ipBlock: { cidr: "10.1.0.0/16" } }] } } } }],
    message: /networkPolicy\.egress\.stores\.to is empty/,
  },
  {
    name: "egress without the brokers' address",
    values: [{ networkPolicy: { egress: { enabled: true, stores: { to: [{ ipBlock: { cidr: "10.2.0.0/16" } }] } } } }],
    message: /networkPolicy\.egress\.kafka\.to is empty/,
  },
  {
    name: "ServiceMonitor without the metrics Service",
    values: [{ metrics: { service: { enabled: false }, serviceMonitor: { enabled: true } }, tests: { enabled: false } }],
    message: /metrics\.serviceMonitor\.enabled needs metrics\.service\.enabled/,
  },
];
