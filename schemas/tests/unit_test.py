"""The schemas without a server: each is valid JSON Schema 2020-12, its
examples pass, documents breaking a rule it states fail, and its lists of
codes are the ones docs/messages.md and the domain name.

    unit_test.py SOURCE_DIR      (exit 0: passed)"""
import json
import re
import sys
from pathlib import Path

from jsonschema import Draft202012Validator

failures = []


def check(ok: bool, what: str):
    if not ok:
        failures.append(what)


def documented_error_codes(source: Path) -> set:
    """The codes of docs/messages.md's `saga.error` table."""
    text = (source / "docs/messages.md").read_text()
    table = text.split("| `saga.error` | the rule broken |", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", table, re.M))


def domain_reasons(source: Path) -> set:
    """The transfer reasons of domain/src/domain.cpp (kReasons)."""
    text = (source / "domain/src/domain.cpp").read_text()
    return set(re.findall(r'"([a-z_]+)"', re.search(r"kReasons\[\] = \{(.*?)\};", text, re.S).group(1)))


def main(source: Path) -> int:
    schemas = {}
    for name in ("request", "outcome", "dead-letter-headers"):
        s = json.loads((source / "schemas" / f"{name}.schema.json").read_text())
        Draft202012Validator.check_schema(s)
        schemas[name] = (s, Draft202012Validator(s))
        for example in s.get("examples", []):
            check(Draft202012Validator(s).is_valid(example), f"{name}: its example {example} fails")

    codes = documented_error_codes(source)
    check(len(codes) >= 20, f"docs/messages.md's table gave only {sorted(codes)}")
    outcome = schemas["outcome"][0]
    headers = schemas["dead-letter-headers"][0]
    check(set(outcome["$defs"]["error_code"]["enum"]) == codes | {"conflict"},
          f"outcome.schema.json's error codes differ from docs/messages.md: "
          f"{set(outcome['$defs']['error_code']['enum']) ^ (codes | {'conflict'})}")
    check(set(headers["properties"]["saga.error"]["enum"]) == codes | {"conflict"},
          "dead-letter-headers.schema.json's saga.error codes differ from docs/messages.md")
    reasons = domain_reasons(source) - {"none", "invalid", "conflict"}
    settled_reasons = set(outcome["$defs"]["settled"]["properties"]["reason"]["enum"]) - {None}
    check(settled_reasons == reasons, f"outcome reasons {settled_reasons} differ from the domain's {reasons}")

    # What each schema must refuse.
    ok_request = {"id": "t-1", "from": "a", "to": "b", "amount": 1}
    done = {"id": "t-1", "state": "done", "reason": None, "from": "a", "to": "b", "amount": 1, "currency": None,
            "metadata": None, "finished_at": "2026-11-21T19:30:00.123Z"}
    rejected = {"id": "t-1", "state": "rejected", "reason": "invalid", "error": "bad_currency",
                "message": "currency must be ...", "request": {"topic": "transfers.requests", "partition": 0, "offset": 7},
                "finished_at": "2026-11-21T19:30:00.123Z"}
    letter = {"saga.reason": "invalid", "saga.error": "bad_id", "saga.message": "id must be ...",
              "saga.source.topic": "transfers.requests", "saga.source.partition": "0", "saga.source.offset": "7"}
    refused = {
        "request": [{**ok_request, "amount": 9223372036854775808}, {**ok_request, "amount": 0},
                    {**ok_request, "amount": 1.5}, {**ok_request, "amount": "5"}, {**ok_request, "id": "a b"},
                    {**ok_request, "id": "i" * 129}, {**ok_request, "from": "f" * 65}, {**ok_request, "to": ""},
                    {**ok_request, "currency": "eur"}, {**ok_request, "currency": None},
                    {**ok_request, "metadata": [1]}, {**ok_request, "memo": "hi"},
                    {k: v for k, v in ok_request.items() if k != "amount"}, [ok_request]],
        "outcome": [{**done, "reason": "insufficient_funds"}, {**done, "state": "canceled"},
                    {**done, "state": "pending"}, {**done, "finished_at": "2026-11-21 19:30:00"},
                    {k: v for k, v in done.items() if k != "currency"}, {**done, "extra": 1},
                    {**rejected, "reason": "insufficient_funds"}, {**rejected, "state": "refused"},
                    {**rejected, "id": "a b"}, {k: v for k, v in rejected.items() if k != "message"},
                    {**rejected, "reason": "conflict"}, {**rejected, "error": "conflict"},
                    {**rejected, "request": {"topic": "transfers.requests", "partition": 0}}],
        "dead-letter-headers": [{**letter, "saga.error": "conflict"}, {**letter, "saga.reason": "conflict"},
                                {**letter, "saga.error": "fake"}, {**letter, "saga.spoofed": "x"},
                                {**letter, "saga.source.offset": "-1"}, {**letter, "saga.truncated": "true"},
                                {**letter, "saga.truncated": "true", "saga.original.size": "900000",
                                 "traceparent": "00-..."},
                                {k: v for k, v in letter.items() if k != "saga.source.topic"}],
    }
    accepted = {"request": [ok_request, {**ok_request, "amount": 9223372036854775807, "currency": "EUR",
                                         "metadata": {"n": [1, None]}}],
                "outcome": [done, rejected, {**rejected, "reason": "conflict", "error": "conflict"}, {**done, "state": "canceled", "reason": "overflow", "currency": "EUR",
                                             "metadata": {"k": "v"}}],
                "dead-letter-headers": [letter, {**letter, "traceparent": "00-...", "x-null": None},
                                        {**letter, "saga.reason": "conflict", "saga.error": "conflict"},
                                        {**letter, "saga.error": "too_large", "saga.truncated": "true",
                                         "saga.original.size": "900000"}]}
    for name, (_s, v) in schemas.items():
        for doc in refused[name]:
            check(not v.is_valid(doc), f"{name}.schema.json accepts {json.dumps(doc)[:160]}")
        for doc in accepted[name]:
            check(v.is_valid(doc), f"{name}.schema.json refuses {json.dumps(doc)[:160]}: "
                                   f"{[e.message for e in v.iter_errors(doc)]}")
    for f in failures:
        print(f"FAILED: {f}")
    print(f"schemas: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
