"""A second Kafka client against the workers: confluent-kafka (its wheel
bundles a newer librdkafka than Debian's). Publishes `key|value` lines with
an idempotent producer, then reads transfers.results until every id has an
outcome. Exit 0 when it has, 1 otherwise (with the reason on stderr)."""
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer


def main(bootstrap: str, requests_file: str) -> int:
    lines = [l.rstrip("\n").split("|", 1) for l in open(requests_file) if l.strip()]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failed = []
    for key, value in lines:
        producer.produce("transfers.requests", key=key, value=value,
                         on_delivery=lambda err, _m: err and failed.append(err))
        producer.poll(0)
    if producer.flush(60) or failed:
        print(f"not every request was delivered: {failed[:3]}", file=sys.stderr)
        return 1
    wanted = {json.loads(v)["id"] for _, v in lines}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["transfers.results"])
    seen = {}
    deadline = time.monotonic() + 120
    while wanted - seen.keys() and time.monotonic() < deadline:
        m = consumer.poll(1.0)
        if m is None or m.error():
            continue
        outcome = json.loads(m.value())
        if m.key().decode() != outcome["id"] or outcome["state"] not in ("done", "canceled"):
            print(f"malformed outcome: key {m.key()!r}, value {m.value()!r}", file=sys.stderr)
            return 1
        seen[outcome["id"]] = outcome["state"]
    consumer.close()
    missing = wanted - seen.keys()
    if missing:
        print(f"{len(missing)} ids without an outcome, e.g. {sorted(missing)[:3]}", file=sys.stderr)
        return 1
    print(f"confluent-kafka: published {len(lines)}, read {len(seen)} outcomes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
