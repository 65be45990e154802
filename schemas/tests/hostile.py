"""The hostile requests the schema test sends: every file of the fuzz corpus
(tests/fuzz/corpus/parse_request) and the cases of
tests/integration/hostile_input_test.cpp the corpus lacks (sizes, a null
value, keys and headers, nesting). Each is (name, key, value, headers);
value None is a Kafka null."""
import random
from pathlib import Path


def request(id_: str, source: str, to: str, amount: str, extra: str = "") -> bytes:
    return f'{{"id":"{id_}","from":"{source}","to":"{to}","amount":{amount}{extra}}}'.encode()


def nested(id_: str, depth: int) -> bytes:
    return (f'{{"id":"{id_}","from":"h0","to":"h1","amount":1,"metadata":' + '{"a":' * depth + "1"
            + "}" * depth + "}").encode()


def incompressible(n: int) -> str:
    # The worker's producer compresses (lz4) and the broker limits the
    # compressed size: only letters that do not compress reach the limit.
    rng = random.Random(7)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(n))


def corpus(source: Path) -> list:
    folder = source / "tests/fuzz/corpus/parse_request"
    return [(f"corpus {p.name}", b"corpus", p.read_bytes(), []) for p in sorted(folder.iterdir())]


def from_hostile_input_test() -> list:
    ok_tail = b',"from":"h0","to":"h1","amount":1}'
    return [
        ("null value", b"h0", None, []),
        ("64 KiB + 1", b"h0", request("big", "h0", "h1", "1", ',"metadata":{"p":"' + "p" * 65_536 + '"}'), []),
        ("900 KB", b"h0", b"{" * 900_000, []),
        ("33 levels deep", b"h0", nested("deep33", 33), []),
        ("60,000 brackets", b"h0", b"[" * 60_000, []),
        ("escaped key", b"h0", b'{"\\u0069d":"ek"' + ok_tail, []),
        ("missing amount", b"h0", b'{"id":"ma","from":"h0","to":"h1"}', []),
        ("amount 0", b"h0", request("n0", "h0", "h1", "0"), []),
        ("amount 1.0", b"h0", request("nf", "h0", "h1", "1.0"), []),
        ("bad id", b"h0", request("a b", "h0", "h1", "1"), []),
        ("id of 129 characters", b"h0", request("i" * 129, "h0", "h1", "1"), []),
        ("from of 65 characters", b"h0", request("long-from", "f" * 65, "h1", "1"), []),
        ("to not a string", b"h0", b'{"id":"tn","from":"h0","to":7,"amount":1}', []),
        ("currency null", b"h0", request("cn", "h0", "h1", "1", ',"currency":null'), []),
        ("metadata over 4 KiB", b"h0", request("ml", "h0", "h1", "1", ',"metadata":{"p":"' + "p" * 4100 + '"}'), []),
        ("null key, invalid", None, b"?null-key garbage", []),
        ("binary key, invalid", b"\x00\xff key", b"binary-key garbage", []),
        ("spoofed saga.* headers and carried ones", b"h0", b"spoofed",
         [("saga.error", b"fake"), ("saga.reason", b"fake"), ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
          ("x-null", None), ("x-bin", b"\x00\xff")]),
    ]


def cut_on_the_dead_letter_topic() -> list:
    """Larger than the dead-letter topic takes (the test makes it 200,000
    bytes): the worker sends it cut, without the request's headers."""
    return [("500 KB, cut on the dead-letter topic", b"h0",
             request("huge", "h0", "h1", "1", ',"metadata":{"p":"' + incompressible(500_000) + '"}'),
             [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")])]


def conflicting(id_: str) -> list:
    """The same id with two payloads: the first stands, the second is a conflict."""
    return [(f"{id_} first", b"h0", request(id_, "h0", "h1", "250"), []),
            (f"{id_} reused", b"h0", request(id_, "h0", "h1", "251"), [])]
