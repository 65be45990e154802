"""A producer in another language than the workers': publishes one transfer
request and waits for its outcome, checking both against the schemas.

    pip install confluent-kafka==2.16.1 jsonschema==4.26.0
    python produce.py --bootstrap kafka-1:9092 --id t-1 --from acct-1 --to acct-2 --amount 2500 [--currency EUR]

Prints the outcome (one JSON line) and exits 0 when the transfer settled
(done or canceled), 3 when the worker rejected this request (its dead
letter says the same), 1 when no answer came within --timeout, 2 when the
request is refused before sending."""
import argparse
import json
import pathlib
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from jsonschema import Draft202012Validator

SCHEMAS = pathlib.Path(__file__).resolve().parent.parent


def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / f"{name}.schema.json").read_text()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--from", dest="source", required=True)
    p.add_argument("--to", required=True)
    p.add_argument("--amount", type=int, required=True)  # an int: a float would be written 2500.0 and refused
    p.add_argument("--currency")
    p.add_argument("--timeout", type=float, default=60)
    a = p.parse_args()

    request = {"id": a.id, "from": a.source, "to": a.to, "amount": a.amount}
    if a.currency:
        request["currency"] = a.currency
    errors = [e.message for e in validator("request").iter_errors(request)]
    if a.source == a.to:  # the one field rule the schema cannot state
        errors.append("from and to must be different accounts")
    if errors:
        print(f"request refused: {'; '.join(errors)}", file=sys.stderr)
        return 2

    # Read transfers.results from its current end, so only outcomes published
    # after this request are scanned (a fresh group at "earliest" would read
    # the whole history). An id sent before with this payload gets no new outcome.
    consumer = Consumer({"bootstrap.servers": a.bootstrap, "group.id": f"produce-example-{a.id}",
                         "enable.auto.commit": False})
    partitions = consumer.list_topics("transfers.results", timeout=10).topics["transfers.results"].partitions
    starts = [TopicPartition("transfers.results", n, consumer.get_watermark_offsets(
        TopicPartition("transfers.results", n), timeout=10)[1]) for n in partitions]
    consumer.assign(starts)

    # Keyed by the source account; idempotent, so a retry never duplicates.
    producer = Producer({"bootstrap.servers": a.bootstrap, "enable.idempotence": True})
    failed, sent = [], []
    producer.produce("transfers.requests", key=a.source, value=json.dumps(request, separators=(",", ":")),
                     on_delivery=lambda err, msg: failed.append(err) if err else sent.append(msg))
    if producer.flush(30) or failed:
        print(f"request not delivered: {failed or 'timed out'}", file=sys.stderr)
        return 1
    # Where our message is: a `rejected` answer names the message it answers.
    ours = {"topic": "transfers.requests", "partition": sent[0].partition(), "offset": sent[0].offset()}

    outcomes = validator("outcome")
    deadline = time.monotonic() + a.timeout
    while time.monotonic() < deadline:
        m = consumer.poll(1.0)
        if m is None or m.error() or m.key() != a.id.encode():
            continue
        outcome = json.loads(m.value())
        outcomes.validate(outcome)  # raises on a malformed outcome
        if outcome["state"] == "rejected" and outcome["request"] != ours:
            continue  # another message that reused this id was answered, not ours
        print(json.dumps(outcome))
        consumer.close()
        return 3 if outcome["state"] == "rejected" else 0
    consumer.close()
    print(f"no outcome for {a.id} within {a.timeout:g} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
