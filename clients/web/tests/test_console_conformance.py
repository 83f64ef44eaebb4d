"""The web console against the protocol, without a browser or an exchange:
every request the console's modules (clients/web/*.js) send is a `ClientMessage` of protocol/src/messages.rs
with only fields that message has (an order's fields those of
`OrderTicket`), and every server message it handles is a `ServerMessage`
and named in docs/protocol.md. A renamed message or field fails here
instead of as a silent `wrong_type` in a user's browser.

The Python client's side of the same check is
clients/python/tests/test_protocol_conformance.py.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# The console's modules (app.js and what it imports), read as one text.
MODULES = sorted((ROOT / "clients" / "web").glob("*.js"))
APP = "\n".join(path.read_text() for path in MODULES)
MESSAGES = (ROOT / "protocol" / "src" / "messages.rs").read_text()
DOC = (ROOT / "docs" / "protocol.md").read_text()


def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def variants(enum: str) -> dict[str, set[str]]:
    """An enum's struct variants as the wire names them, with their fields."""
    body = MESSAGES.split(f"pub enum {enum} {{")[1].split("\n}\n")[0]
    found: dict[str, set[str]] = {}
    current = None
    for line in body.splitlines():
        start = re.match(r"^    ([A-Z][A-Za-z]+)\s*\{(.*)$", line)
        if start:
            current = snake(start.group(1))
            found[current] = set(re.findall(r"(\w+):", start.group(2)))
            if start.group(2).rstrip().endswith("},"):
                current = None
            continue
        field = re.match(r"^        (?:pub )?(\w+):", line)
        if current and field:
            found[current].add(field.group(1))
        if re.match(r"^    \},?$", line):
            current = None
    return found


def struct_fields(name: str) -> set[str]:
    body = MESSAGES.split(f"pub struct {name} {{")[1].split("\n}\n")[0]
    return set(re.findall(r"^    pub (\w+):", body, re.M))


def object_keys(literal: str) -> set[str]:
    """The keys of a JavaScript object literal's top level (`{ a, b: 1 }`)."""
    depth, keys, item = 0, set(), ""
    for ch in literal.strip()[1:-1] + ",":
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            key = re.match(r"\s*(\w+)\s*(:|$)", item)
            if key:
                keys.add(key.group(1))
            item = ""
        else:
            item += ch
    return keys


def sent_requests() -> list[tuple[str, set[str]]]:
    """Each `request("name", {..})` and `act("name", {..})` with a literal name."""
    sent = []
    for match in re.finditer(r'\b(?:request|act)\("([a-z_]+)"(\s*,\s*\{)?', APP):
        keys: set[str] = set()
        if match.group(2):
            start = match.end() - 1
            depth, end = 0, start
            for end in range(start, len(APP)):
                depth += {"{": 1, "}": -1}.get(APP[end], 0)
                if depth == 0:
                    break
            keys = object_keys(APP[start : end + 1])
        sent.append((match.group(1), keys))
    return sent


def test_every_request_the_console_sends_is_a_client_message_with_its_fields():
    client = variants("ClientMessage")
    sent = sent_requests()
    assert len(sent) >= 30, sent
    for name, keys in sent:
        assert name in client, f"the console sends {name!r}, which is no ClientMessage"
        assert keys <= client[name] - {"id"}, f"{name}: {keys - client[name]} are not fields of the message"


def test_the_tickets_order_has_only_order_ticket_fields():
    literal = APP.split("  const order = {", 1)[1].split("\n  };", 1)[0]
    keys = object_keys("{" + literal + "}")
    assert {"client_order_id", "instrument", "side", "quantity"} <= keys, keys
    assert keys <= struct_fields("OrderTicket"), keys - struct_fields("OrderTicket")


def test_every_server_message_the_console_handles_is_one_the_exchange_sends():
    server = variants("ServerMessage")
    handled = set(re.findall(r'type === "([a-z_]+)"', APP))
    assert {"book_snapshot", "book_update", "trade", "private", "delivery", "job_update", "market_data", "book_conflated"} <= handled, handled
    for name in handled:
        assert name in server, f"the console handles {name!r}, which is no ServerMessage"
        assert f'{{"{name}":' in DOC or f'`{name}`' in DOC, f"{name} is not in docs/protocol.md"


def test_the_checks_catch_a_wrong_name_and_a_wrong_field():
    # The parsers themselves: a misspelt request and a field no message has.
    client = variants("ClientMessage")
    assert "book_offer" not in client and "book_offers" in client
    assert "offset" in client["book_offers"] and "page" not in client["book_offers"]
    assert object_keys('{ instrument, offset: 0, after: f(a, b) }') == {"instrument", "offset", "after"}


def test_the_modules_import_what_they_use_and_nothing_else_is_global():
    """Each module imports every name it takes from another (an ES module
    sees no other's top level, so a missing import is a ReferenceError in a
    user's browser on the first click that reaches it), every import is an
    export of the module named, and only app.js sets a global."""
    exported, imported, defined, code = {}, {}, {}, {}
    for path in MODULES:
        text = path.read_text()
        code[path.name] = re.sub(r"//[^\n]*", "", text)
        exported[path.name] = set(re.findall(r"^export (?:async )?(?:function|const|let) ([\w$]+)", text, re.M))
        defined[path.name] = set(re.findall(r"^(?:export )?(?:async )?(?:function|const|let) ([\w$]+)", text, re.M))
        imported[path.name] = {}
        for names, module in re.findall(r'^import \{ (.*) \} from "\./([\w]+\.js)";$', text, re.M):
            for name in names.split(", "):
                imported[path.name][name] = module
    assert "app.js" in exported and len(MODULES) >= 6, [path.name for path in MODULES]
    for module, names in imported.items():
        for name, source in names.items():
            assert name in exported.get(source, set()), f"{module} imports {name} from {source}, which does not export it"
    everywhere = {name: module for module, names in defined.items() for name in names}
    for module, text in code.items():
        for name, home in everywhere.items():
            if home == module or name in defined[module]:
                continue
            used = re.search(r"(?<![\w$])(?<![\w\)\]]\.)" + re.escape(name) + r"(?![\w$])", text)
            assert not used or name in imported[module], f"{module} uses {name} of {home} without importing it"
    for module, text in code.items():
        globals_set = re.findall(r"^window\.(\w+) =", text, re.M)
        assert globals_set == (["gpuxConsole"] if module == "app.js" else []), (module, globals_set)
