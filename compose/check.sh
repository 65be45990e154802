#!/usr/bin/env bash
# Checks compose.yaml with Compose itself (Debian's docker-compose, which
# parses and validates without an engine): it is valid, and it resolves to
# the services, replicas and settings the file promises.
set -euo pipefail
file="${1:?usage: check.sh compose.yaml}"
compose() { docker-compose -f "$file" "$@"; }
fail() { echo "compose check: $*" >&2; exit 1; }

compose config -q || fail "docker-compose config refused $file"
services="$(compose config --services | sort | tr '\n' ' ')"
[ "$services" = "kafka migrate postgres topics worker " ] || fail "services are '$services'"
resolved="$(SAGA_PG_PASSWORD=s3cret compose config)"
grep -q "replicas: 3" <<<"$resolved" || fail "the workers are not 3 replicas"
grep -q "SAGA_STORE: postgresql://sagapool:s3cret@postgres:5432/ledger" <<<"$resolved" \
  || fail "SAGA_PG_PASSWORD does not reach SAGA_STORE"
grep -q 'KAFKA_AUTO_CREATE_TOPICS_ENABLE: "false"' <<<"$resolved" || fail "Kafka would create topics itself"
echo "compose check: $file is valid: $services"
