#!/usr/bin/env bash
# A real Apache Kafka for the demo, the tests and users: KRaft nodes, each a
# broker and a controller, on loopback ports.
#   kafka.sh fetch                           the pinned jars from Maven Central (once)
#   kafka.sh run [--brokers 1|3] [--dir D] [--security sasl_ssl --users FILE]
#                                            start, wait until ready, print the
#                                            bootstrap servers, stop everything on exit
#   kafka.sh topics --bootstrap B [--partitions P] [--replication R] NAME...
#                                            create topics if missing
#   kafka.sh tool CLASS [ARGS...]            one of Kafka's own tools (console producer, ...)
#   kafka.sh configure --brokers N --dir D [--security sasl_ssl --users FILE]
#                                            format N nodes (what run and the tests use)
#   kafka.sh node --dir D --node I           run one configured node in the foreground
# The jars live in $SAGA_KAFKA_HOME (default ~/.cache/sagapool/kafka-3.9.1).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
KAFKA_VERSION=3.9.1

die() { echo "kafka.sh: $*" >&2; exit 1; }
jar_dir() { echo "${SAGA_KAFKA_HOME:-$HOME/.cache/sagapool/kafka-$KAFKA_VERSION}"; }

# --- fetch: idempotent; the marker is written last, so a broken download is redone
cmd_fetch() {
  local jars; jars="$(jar_dir)"
  [ -f "$jars/.complete" ] && return 0
  command -v java >/dev/null && command -v mvn >/dev/null \
    || die "java and mvn are needed (./dev installs openjdk-17-jre-headless and maven)"
  echo "kafka.sh: fetching Apache Kafka $KAFKA_VERSION from Maven Central into $jars" >&2
  rm -rf "$jars.part"
  mvn -q -B -f "$HERE/pom.xml" dependency:copy-dependencies -DoutputDirectory="$jars.part" >&2 \
    || die "mvn could not fetch Kafka's jars"
  rm -rf "$jars"
  mv "$jars.part" "$jars"
  touch "$jars/.complete"
}

# --- configure: format N KRaft nodes under DIR, print the bootstrap servers
# --brokers N and --dir D of configure and run, into $nodes and $dir.
parse_cluster_args() {
  nodes=1 dir="" security=plaintext users=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --brokers) nodes="${2:?--brokers needs 1 or 3}"; shift 2 ;;
      --dir) dir="${2:?--dir needs a folder}"; shift 2 ;;
      --security) security="${2:?--security needs plaintext or sasl_ssl}"; shift 2 ;;
      --users) users="${2:?--users needs a file of 'name password' lines}"; shift 2 ;;
      *) die "unknown argument '$1' (expected --brokers 1|3, --dir DIR, --security plaintext|sasl_ssl, --users FILE)" ;;
    esac
  done
  case "$nodes" in 1|3) ;; *) die "--brokers must be 1 or 3 (a KRaft quorum of 2 survives nothing)" ;; esac
  case "$security" in plaintext|sasl_ssl) ;; *) die "--security must be plaintext or sasl_ssl" ;; esac
  [ -z "$users" ] || [ -r "$users" ] || die "--users: cannot read '$users'"
}

# --- TLS for sasl_ssl: a CA and one broker certificate (every node listens
# on 127.0.0.1), made with openssl under DIR/tls. Clients trust DIR/tls/ca.pem.
make_tls() {
  local tls="$1/tls"
  mkdir -p "$tls"
  {
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=sagapool test CA" \
      -keyout "$tls/ca.key" -out "$tls/ca.pem"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
      -keyout "$tls/broker.key" -out "$tls/broker.csr"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$tls/san.ext"
    openssl x509 -req -days 30 -in "$tls/broker.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
      -CAcreateserial -extfile "$tls/san.ext" -out "$tls/broker.pem"
  } >"$tls/openssl.log" 2>&1 || die "openssl failed: $(tail -3 "$tls/openssl.log")"
  # Kafka's PEM key store: the (PKCS#8, unencrypted) key, then the certificate.
  cat "$tls/broker.key" "$tls/broker.pem" >"$tls/broker.keystore.pem"
  chmod 600 "$tls"/*.key "$tls/broker.keystore.pem"
}

cmd_configure() {
  local nodes dir security users
  parse_cluster_args "$@"
  [ -n "$dir" ] || die "configure: --dir is required"
  local jars; jars="$(jar_dir)"
  [ -f "$jars/.complete" ] || die "Kafka's jars are missing: run 'tools/kafka/kafka.sh fetch' first"
  mkdir -p "$dir"
  # 2 ports a node (clients, controller), checked free and released at once;
  # the node binds them a few seconds later. They are picked below the
  # kernel's ephemeral range, so no client's outgoing connection (say, a
  # worker reconnecting while the whole cluster restarts) can take one.
  local ports
  read -r -a ports <<<"$(python3 - "$((2 * nodes))" <<'PY'
import random, socket, sys
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
held = []
while len(held) < int(sys.argv[1]):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(10000, low) if low > 11000 else 0))
        held.append(s)
    except OSError:
        s.close()
print(" ".join(str(s.getsockname()[1]) for s in held))
PY
)"
  local voters="" bootstrap="" i
  for ((i = 1; i <= nodes; i++)); do
    voters+="${voters:+,}$i@127.0.0.1:${ports[$((2 * i - 1))]}"
    bootstrap+="${bootstrap:+,}127.0.0.1:${ports[$((2 * i - 2))]}"
  done
  local rf=$((nodes < 3 ? nodes : 3)) isr=$((nodes < 2 ? nodes : 2))
  # sasl_ssl: clients and brokers meet on SASL_SSL with SCRAM-SHA-512, ACLs
  # are enforced, and "admin" (password in DIR/admin.*) is the super user.
  local listener=PLAINTEXT security_props="" scram=() admin_password=""
  if [ "$security" = sasl_ssl ]; then
    listener=SASL_SSL
    make_tls "$dir"
    admin_password="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
    scram+=(--add-scram "SCRAM-SHA-512=[name=admin,password=$admin_password]")
    if [ -n "$users" ]; then
      local name password
      while read -r name password; do
        [ -n "$name" ] && scram+=(--add-scram "SCRAM-SHA-512=[name=$name,password=$password]")
      done <"$users"
    fi
    # The controller listener stays PLAINTEXT on loopback: brokers reach the
    # controllers there as User:ANONYMOUS, hence its place in super.users.
    security_props="sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"$admin_password\";
ssl.keystore.type=PEM
ssl.keystore.location=$dir/tls/broker.keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$dir/tls/ca.pem
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin;User:ANONYMOUS"
    cat >"$dir/admin.properties" <<ADMIN
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_password";
ssl.truststore.type=PEM
ssl.truststore.location=$dir/tls/ca.pem
ADMIN
    cat >"$dir/admin.librdkafka" <<ADMIN
security.protocol=SASL_SSL
sasl.mechanisms=SCRAM-SHA-512
sasl.username=admin
sasl.password=$admin_password
ssl.ca.location=$dir/tls/ca.pem
ADMIN
    chmod 600 "$dir/admin.properties" "$dir/admin.librdkafka"
  fi
  # A random cluster id; one in 64 starts with '-', hence --cluster-id=ID.
  local cluster_id
  cluster_id="$(python3 -c 'import uuid, base64; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')"
  cat >"$dir/log4j.properties" <<'L4J'
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
L4J
  for ((i = 1; i <= nodes; i++)); do
    local node_dir="$dir/node-$i"
    mkdir -p "$node_dir"
    cat >"$node_dir/server.properties" <<PROPS
# Written by tools/kafka/kafka.sh configure: node $i of $nodes, each a broker
# and a controller (KRaft combined mode), on loopback only.
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=$listener://127.0.0.1:${ports[$((2 * i - 2))]},CONTROLLER://127.0.0.1:${ports[$((2 * i - 1))]}
advertised.listeners=$listener://127.0.0.1:${ports[$((2 * i - 2))]}
listener.security.protocol.map=$listener:$listener,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=$listener
$security_props
log.dirs=$node_dir/data
# Topics are created on purpose, with their replication (docs/kafka.md).
auto.create.topics.enable=false
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
# Tests start groups at once; production keeps the 3 s default.
group.initial.rebalance.delay.ms=0
PROPS
    java -cp "$jars/*" -Dlog4j.configuration="file:$dir/log4j.properties" kafka.tools.StorageTool \
      format --cluster-id="$cluster_id" -c "$node_dir/server.properties" --ignore-formatted "${scram[@]}" >"$node_dir/format.log" 2>&1 \
      || die "formatting node $i failed: $(tail -5 "$node_dir/format.log")"
  done
  echo "$bootstrap" >"$dir/bootstrap"
  echo "bootstrap: $bootstrap"
}

# --- node: run one configured node in the foreground (exec: its pid is the JVM's)
cmd_node() {
  local dir="" node=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --dir) dir="$2"; shift 2 ;;
      --node) node="$2"; shift 2 ;;
      *) die "node: unknown argument '$1'" ;;
    esac
  done
  [ -f "$dir/node-$node/server.properties" ] || die "node: no node '$node' configured under '$dir'"
  local jars; jars="$(jar_dir)"
  echo $$ >"$dir/node-$node.pid"  # exec keeps the pid: it is the JVM's
  exec java -Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j.configuration="file:$dir/log4j.properties" -cp "$jars/*" \
    kafka.Kafka "$dir/node-$node/server.properties"
}

# --- topics: create topics if missing, with Kafka's own TopicCommand
cmd_topics() {
  local bootstrap="" partitions=12 replication=1 names=() name out
  while [ $# -gt 0 ]; do
    case "$1" in
      --bootstrap) bootstrap="${2:?--bootstrap needs host:port[,...]}"; shift 2 ;;
      --partitions) partitions="${2:?--partitions needs a number}"; shift 2 ;;
      --replication) replication="${2:?--replication needs a number}"; shift 2 ;;
      -*) die "topics: unknown argument '$1'" ;;
      *) names+=("$1"); shift ;;
    esac
  done
  [ -n "$bootstrap" ] && [ ${#names[@]} -gt 0 ] \
    || die "usage: kafka.sh topics --bootstrap B [--partitions P] [--replication R] NAME..."
  local jars; jars="$(jar_dir)"
  for name in "${names[@]}"; do
    out="$(java -cp "$jars/*" -Dlog4j.configuration="file:$HERE/tools-log4j.properties" \
      org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
      --create --if-not-exists --topic "$name" --partitions "$partitions" \
      --replication-factor "$replication" \
      --config "min.insync.replicas=$((replication < 2 ? replication : 2))" 2>&1)" \
      || die "could not create topic $name: $(echo "$out" | grep -v '^log4j:' | tail -3)"
  done
}

# --- tool: one of Kafka's own command-line tools, by class name, e.g.
# org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --describe ...
cmd_tool() {
  [ $# -gt 0 ] || die "usage: kafka.sh tool CLASS [ARGS...]"
  local jars; jars="$(jar_dir)"
  exec java -cp "$jars/*" -Dlog4j.configuration="file:$HERE/tools-log4j.properties" "$@"
}

# --- run: configure, start every node as a child, wait, serve until a signal
cmd_run() {
  local nodes dir security users
  parse_cluster_args "$@"
  local own_dir=""
  if [ -z "$dir" ]; then
    dir="$(mktemp -d -t sagapool-kafka.XXXXXX)"
    own_dir="$dir"
  fi
  cmd_fetch
  cmd_configure --brokers "$nodes" --dir "$dir" --security "$security" ${users:+--users "$users"} >/dev/null
  local kcat_conf=()
  [ "$security" = plaintext ] || kcat_conf=(-F "$dir/admin.librdkafka")
  local i
  stop_all() {
    trap - EXIT INT TERM
    local pids
    pids="$(cat "$dir"/node-*.pid 2>/dev/null || true)"
    if [ -n "$pids" ]; then
      kill -CONT $pids 2>/dev/null || true
      kill -TERM $pids 2>/dev/null || true
      # A node that outlasts the grace (a controlled shutdown with no quorum
      # left) is killed: its data is on disk.
      for _ in $(seq 1 30); do
        kill -0 $pids 2>/dev/null || break
        sleep 1
      done
      kill -KILL $pids 2>/dev/null || true
    fi
    [ -z "$own_dir" ] || rm -rf "$own_dir"
    exit 0
  }
  trap stop_all EXIT INT TERM
  for ((i = 1; i <= nodes; i++)); do
    # A watchdog per node: if this launcher is SIGKILLed (no trap runs), it
    # sees its parent gone and kills the node. The launcher stops the nodes
    # itself otherwise, so the watchdog ignores TERM and INT.
    (
      "$HERE/kafka.sh" node --dir "$dir" --node "$i" >"$dir/node-$i.log" 2>&1 &
      node_pid=$!
      trap '' TERM INT  # after the fork: the node itself must still take TERM
      while kill -0 "$node_pid" 2>/dev/null; do
        kill -0 "$$" 2>/dev/null || { kill -KILL "$node_pid"; exit 0; }
        sleep 1
      done
    ) &
  done
  local bootstrap; bootstrap="$(cat "$dir/bootstrap")"
  local live=0
  for _ in $(seq 1 120); do
    live="$(kcat "${kcat_conf[@]}" -b "$bootstrap" -L -m 2 2>/dev/null | grep -c '^  broker [0-9]* at' || true)"
    [ "$live" = "$nodes" ] && break
    sleep 1
  done
  if [ "$live" != "$nodes" ]; then
    for ((i = 1; i <= nodes; i++)); do echo "--- node $i" >&2; tail -20 "$dir/node-$i.log" >&2; done
    die "$live of $nodes brokers live after 120 s"
  fi
  echo "bootstrap: $bootstrap"
  [ "$security" = plaintext ] || echo "security: SASL_SSL, SCRAM-SHA-512; CA $dir/tls/ca.pem; super user's client settings $dir/admin.librdkafka (librdkafka) and $dir/admin.properties (Kafka's tools)"
  wait
}

cmd="${1:-}"; [ $# -gt 0 ] && shift
case "$cmd" in
  fetch | configure | node | run | topics | tool) "cmd_$cmd" "$@" ;;
  *) die "usage: kafka.sh fetch | tool CLASS ARGS... | run [--brokers 1|3] [--dir DIR] | topics --bootstrap B [--partitions P] [--replication R] NAME... | configure --brokers N --dir DIR | node --dir DIR --node I" ;;
esac
