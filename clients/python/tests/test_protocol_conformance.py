"""The Python client against docs/protocol.md and the Rust protocol crate,
without an exchange: every server example in the document parses into the
message the client models with none of its documented fields dropped, and
every request the protocol has (the Rust `ClientMessage` enum) is one this
client sends, but for those only a supplier's agent sends.

The Rust side of the same check is protocol/tests/docs.rs (every example
decodes with the real codec and re-encodes to the same JSON).
"""

import json
import re
from pathlib import Path

import dataclasses

import gpux
from gpux import answers, messages

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "protocol.md").read_text()

# The supplier agent's own traffic (usage reports, hardware challenges,
# delivery status, its encryption key, log relays, interconnect probes): the
# Rust agent sends it.
AGENT_ONLY = {"usage_report", "challenge_commit", "challenge_opening", "memory_opening", "delivery_status", "set_encryption_key", "logs", "exec_done", "fabric_probe"}


def examples(kind: str) -> list[dict]:
    return [json.loads(block.split("```")[0]) for block in DOC.split(f"```json {kind}\n")[1:]]


def protocol_requests() -> list[str]:
    """`ClientMessage`'s variants as the wire names them (snake_case)."""
    source = (ROOT / "protocol" / "src" / "messages.rs").read_text()
    body = source.split("pub enum ClientMessage {")[1].split("\n}\n")[0]
    names = re.findall(r"^    ([A-Z][A-Za-z]+)\s*\{", body, re.M)
    return [re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower() for name in names]


def requests_the_client_sends() -> set[str]:
    source = (ROOT / "clients" / "python" / "gpux" / "client.py").read_text()
    return set(re.findall(r'request\(\s*"([a-z_]+)"', source)) | set(re.findall(r'"([a-z_]+)":\s*\{', source))


def test_every_server_example_parses_with_its_documented_fields_kept():
    found = examples("server")
    assert len(found) >= 12, len(found)
    for example in found:
        (kind, body), = example.items()
        parsed = gpux.parse(example)
        if kind == "private":
            assert isinstance(parsed, gpux.Private) and parsed.seq == body["event"]["seq"], example
            continue
        if isinstance(parsed, gpux.Record):
            # A typed answer: every documented field is a field of its record
            # (nothing left over in `extra`, at any depth), and the record
            # gives back the object it was read from.
            assert unmodelled(parsed) == [], f"{kind}: not modelled: {unmodelled(parsed)}"
            assert parsed.to_wire() == body, kind
        elif isinstance(parsed, messages.Unknown):
            # Not modelled: the whole body is kept for the caller.
            assert parsed.type == kind and parsed.fields == body, example
        else:
            kept = set(type(parsed).__dataclass_fields__)
            assert set(body) <= kept, f"{kind}: {set(body) - kept} dropped"
        if "id" in body and kind != "error":
            assert messages.answer_id(parsed) == body["id"], example


def unmodelled(record, path="") -> list[str]:
    """The fields of `record` and of the records inside it kept in `extra`."""
    found = [f"{path}{name}" for name in record.extra]
    for each in dataclasses.fields(record):
        value = getattr(record, each.name)
        for index, inner in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(inner, gpux.Record):
                found += unmodelled(inner, f"{path}{each.name}[{index}].")
    return found


def test_the_answers_the_client_reads_are_typed_records():
    """Every answer a request of the client gets is a record, not a dict:
    the answers in the document of every request the client sends."""
    documented = {next(iter(example)) for example in examples("server")}
    pushed_or_framed = {"private", "market_data", "challenge", "authenticated", "ack", "reject", "error"}
    agent = {"usage_accepted", "usage_rejected", "gpu_challenge", "challenge_rows", "gpu_memory_challenge"}
    untyped = {
        kind for kind in documented - pushed_or_framed - agent
        if not issubclass(messages._TYPES.get(kind) or answers.ANSWERS.get(kind, messages.Unknown), (gpux.Record,) + tuple(messages._TYPES.values()))
    }
    assert not untyped, f"answers the client reads as dicts: {sorted(untyped)}"
    line = gpux.parse({"statement": {"id": 1, "lines": [{"transfer": 1, "at_ms": 2, "from": "external", "to": "available:2", "amount_minor": 3, "lease": None, "kind": "deposit", "description": "d", "new": 4}], "next_after": None}}).lines[0]
    assert isinstance(line, answers.StatementLine) and line.from_ == "external" and line.extra == {"new": 4}, "a newer field is kept"


def test_every_request_the_protocol_has_is_one_the_client_sends():
    requests = protocol_requests()
    assert "new_order" in requests and "listing" in requests and len(requests) >= 40, requests
    missing = set(requests) - AGENT_ONLY - requests_the_client_sends()
    assert not missing, f"requests the Python client cannot send: {sorted(missing)}"
    documented = {next(iter(example)) for example in examples("client")}
    assert documented <= set(requests), documented - set(requests)


def test_an_order_ticket_states_every_field_the_protocol_reads():
    example = next(e for e in examples("client") if "new_order" in e and e["new_order"]["order"].get("regions"))
    stated = set(example["new_order"]["order"])
    wire = gpux.OrderTicket.limit(0, "buy", 1, 1).to_wire()
    assert stated <= set(wire), stated - set(wire)
    source = (ROOT / "protocol" / "src" / "messages.rs").read_text()
    ticket = source.split("pub struct OrderTicket {")[1].split("\n}\n")[0]
    fields = set(re.findall(r"^    pub ([a-z_]+):", ticket, re.M))
    assert fields == set(wire), f"Rust has {sorted(fields - set(wire))}, Python has {sorted(set(wire) - fields)}"
