"""Typed gpux messages (docs/protocol.md).

Every message on the wire is a JSON object with exactly one key, the message
type, holding its fields. Requests are built with the helpers here; answers
and pushed messages are parsed into dataclasses by `parse`, with `Unknown`
for any type this client does not model (so a newer exchange never breaks
an older client). Money is in integer minor units of the exchange's
currency (`Client.currency()`; the demo's is US dollars, 1 = US$0.000001).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Optional

from .answers import ANSWERS, JobInfo, Record, ServiceInfo, VolumeInfo

MINOR_PER_DOLLAR = 1_000_000


class AmountError(ValueError):
    """Text that is not an amount under the one rule every gpux client
    follows (docs/first-hour.md "Amounts"): digits with at most one `.`
    before the decimals, no thousands separators, no more decimals than the
    currency's minor unit. A comma is refused whatever it was meant as;
    the message shows each reading."""


def _major(text: str | int | Decimal, code: str) -> Decimal:
    """An amount in major units, checked: `$` before it on a dollar
    exchange, the currency's code after it."""
    if isinstance(text, bool) or isinstance(text, float):
        raise AmountError(f"{text!r}: a float is not exact; pass the amount as a string, e.g. \"2.50\"")
    if isinstance(text, (int, Decimal)):
        value = Decimal(text)
        if not value.is_finite() or value < 0:
            raise AmountError(f"{text!r}: amounts are finite and not negative")
        return value
    body = text.strip()
    if code == "USD" and body.startswith("$"):
        body = body[1:]
    if body.endswith(code):
        body = body[: -len(code)].rstrip()
    if "," in body:
        whole = body.replace(",", "")
        readings = f"`{body.replace(',', '.')}` or `{whole}`" if body.count(",") == 1 and "." not in body else f"`{whole}`"
        raise AmountError(f"{text!r}: `.` is the only decimal separator and amounts take no thousands separators: write {readings}")
    whole, _, fraction = body.partition(".")
    if not (whole.isascii() and whole.isdigit()) or ("." in body and not (fraction.isascii() and fraction.isdigit())):
        raise AmountError(f"{text!r} is not an amount in {code} (digits with at most one `.`, e.g. 2.50)")
    return Decimal(body)


def dollars(text: str | int | Decimal) -> int:
    """Dollars to minor units, exactly; more than six decimals is an error
    (`AmountError`)."""
    minor = _major(text, "USD") * MINOR_PER_DOLLAR
    if minor != minor.to_integral_value():
        raise AmountError(f"{text!r}: at most six decimals (the exchange counts USD to 10^-6)")
    return int(minor)


@dataclass(frozen=True)
class Currency:
    """The exchange's currency (`listing`'s `currency`): what every amount
    is counted in, `decimals` being the minor unit (10^-decimals)."""

    code: str
    decimals: int

    def to_minor(self, text: str | int | Decimal) -> int:
        """An amount in major units ("15.05") to minor units, exactly; more
        decimals than the minor unit has is an error, never rounded."""
        minor = _major(text, self.code) * (10 ** self.decimals)
        if minor != minor.to_integral_value():
            raise AmountError(f"{text!r}: at most {self.decimals} decimals (the exchange counts {self.code} to 10^-{self.decimals})")
        return int(minor)

    def format(self, minor: int) -> str:
        """Minor units as people read them: `$2.50` for US dollars,
        `15.05 CNY` otherwise; cents always, further decimals only where the
        amount has them."""
        whole, fraction = divmod(minor, 10 ** self.decimals)
        text = str(whole)
        if self.decimals:
            digits = str(fraction).rjust(self.decimals, "0")
            kept = digits.rstrip("0")
            text += "." + (digits if self.decimals < 2 else kept.ljust(2, "0"))
        return f"${text}" if self.code == "USD" else f"{text} {self.code}"


@dataclass
class OrderTicket:
    """A new order (`new_order`'s `order`); defaults as documented."""

    client_order_id: int
    instrument: int
    side: str  # "buy" | "sell"
    quantity: int
    price_minor_per_gpu_hour: int = 0
    order_type: str = "limit"  # "limit" | "market"
    time_in_force: Any = "gtc"  # "gtc" | "ioc" | "fok" | {"gtt": {"expire_at_ms": ...}}
    post_only: bool = False
    one_host: bool = False
    min_quantity: int = 0
    self_trade_prevention: str = "cancel_newest"
    duration: Any = field(default_factory=lambda: {"hours": 1})  # or {"minutes": 90}, or "until_cancelled"
    supply: Optional[dict] = None  # {"host": id, "gpu_mask": bits} on a GPU owner's ask
    rematch: bool = False  # spot bids: replace a lease whose host fails it
    min_supplier_score_bps: int = 0  # bids: only sellers scoring at least this (1-10000; 0: any)
    verified_only: bool = False  # bids: only GPUs a hardware challenge verified
    all_or_none: bool = False  # bids: the whole quantity in one pass or nothing; rests until it can
    budget_minor: int = 0  # bids: spend at most this; quantity is then the most GPUs wanted
    stop_price_minor_per_gpu_hour: int = 0  # a stop: off the book until a trade reaches this
    regions: list = field(default_factory=list)  # bids: only GPUs of hosts in these regions ([]: any)
    nodes: int = 0  # bids: a cluster bid for this many hosts on one fabric (0: not a cluster)
    min_fabric_gbps: int = 0  # cluster bids: the fabric's least bandwidth per host, Gb/s
    volumes: list = field(default_factory=list)  # bids with a workload: [{"volume", "mount", "read_only"}] mounted into each lease

    _next_id = [0]

    @classmethod
    def stop_limit(cls, instrument: int, side: str, stop: int, price: int, quantity: int, **kwargs: Any) -> "OrderTicket":
        """A stop-limit order: armed off the book until a trade prints at
        `stop` or beyond (a bid: at or above; an ask: at or below), then a
        limit order at `price` (docs/market-rules.md "Stop orders")."""
        return cls.limit(instrument, side, price, quantity, stop_price_minor_per_gpu_hour=stop, **kwargs)

    @classmethod
    def with_budget(cls, instrument: int, price: int, budget: int, max_gpus: int, **kwargs: Any) -> "OrderTicket":
        """A bid that spends at most `budget` (minor units) on whole GPUs at
        `price` or better, up to `max_gpus` (docs/market-rules.md "Budget orders")."""
        return cls.limit(instrument, "buy", price, max_gpus, budget_minor=budget, **kwargs)

    @classmethod
    def all_or_none_bid(cls, instrument: int, price: int, quantity: int, **kwargs: Any) -> "OrderTicket":
        """A bid for `quantity` GPUs from any hosts in one fill, or none; it
        rests untraded until the book can fill it whole (docs/market-rules.md "All-or-none")."""
        return cls.limit(instrument, "buy", price, quantity, all_or_none=True, **kwargs)

    @classmethod
    def cluster_bid(cls, instrument: int, price: int, nodes: int, gpus_per_node: int, min_fabric_gbps: int = 0, **kwargs: Any) -> "OrderTicket":
        """A bid for `nodes` hosts with `gpus_per_node` GPUs each, all on one
        supplier's fabric in one zone, all or none (docs/market-rules.md
        "Cluster bids")."""
        return cls.limit(instrument, "buy", price, nodes * gpus_per_node, nodes=nodes, min_fabric_gbps=min_fabric_gbps, **kwargs)

    @classmethod
    def limit(cls, instrument: int, side: str, price: int, quantity: int, **kwargs: Any) -> "OrderTicket":
        cls._next_id[0] += 1
        client_order_id = kwargs.pop("client_order_id", None) or _now_ms() * 1000 + cls._next_id[0] % 1000
        return cls(client_order_id=client_order_id, instrument=instrument, side=side, quantity=quantity, price_minor_per_gpu_hour=price, **kwargs)

    def to_wire(self) -> dict:
        return {
            "client_order_id": self.client_order_id,
            "instrument": self.instrument,
            "side": self.side,
            "order_type": self.order_type,
            "price_minor_per_gpu_hour": self.price_minor_per_gpu_hour,
            "quantity": self.quantity,
            "time_in_force": self.time_in_force,
            "post_only": self.post_only,
            "self_trade_prevention": self.self_trade_prevention,
            "min_quantity": self.min_quantity,
            "one_host": self.one_host,
            "duration": self.duration,
            "supply": self.supply,
            "rematch": self.rematch,
            "min_supplier_score_bps": self.min_supplier_score_bps,
            "verified_only": self.verified_only,
            "all_or_none": self.all_or_none,
            "budget_minor": self.budget_minor,
            "stop_price_minor_per_gpu_hour": self.stop_price_minor_per_gpu_hour,
            "regions": list(self.regions),
            "nodes": self.nodes,
            "min_fabric_gbps": self.min_fabric_gbps,
            "volumes": list(self.volumes),
        }


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


# --- answers and pushed messages -------------------------------------------------


@dataclass
class Challenge:
    nonce: str
    server_time_ms: int


@dataclass
class Authenticated:
    id: int
    account: int
    role: str


@dataclass
class Ack:
    id: int
    journal_seq: int
    order: Optional[int] = None


@dataclass
class Reject:
    """The engine refused a command (journaled); `code` is stable."""

    id: int
    journal_seq: int
    code: str
    message: str
    # The bound it ran into ({tick_minor, min, max, needed_minor,
    # available_minor}), None for codes without one.
    bound: Optional[dict] = None


@dataclass
class Error:
    """The gateway refused a frame or request before the engine."""

    id: Optional[int]
    code: str
    message: str


@dataclass
class Balance:
    id: int
    available_minor: int
    held_minor: int
    payable_minor: int
    debt_minor: int


@dataclass
class BookSnapshot:
    instrument: int
    seq: int
    bids: list
    asks: list


@dataclass
class BookUpdate:
    instrument: int
    seq: int
    side: str
    price_minor_per_gpu_hour: int
    quantity: int


@dataclass
class BookConflated:
    """Market-data version 2: the net effect of a book's updates from_seq
    to seq, each level's total now (quantity 0: gone)."""

    instrument: int
    from_seq: int
    seq: int
    bids: list
    asks: list


@dataclass
class MarketData:
    """Market-data version 2: several feed messages in one frame, parsed,
    in the order they happened."""

    messages: list


@dataclass
class Trade:
    instrument: int
    seq: int
    price_minor_per_gpu_hour: int
    quantity: int
    aggressor: str
    at_ms: int


@dataclass
class Private:
    """An engine event about the account: `kind` is its type, `fields` its body."""

    seq: int
    at_ms: int
    kind: str
    fields: dict
    reason: Optional[str] = None  # why, for a "rejected" event


@dataclass
class Delivery:
    """Pushed to a lease's renter at every delivery status its host reports;
    `state` is the wire STATE (see gpux.delivery.describe)."""

    lease: int
    state: Any
    at_ms: int


@dataclass
class LeaseDelivery:
    """A lease's workload (public part) and last delivery status."""

    id: int
    lease: int
    workload: Optional[dict] = None
    state: Any = None
    at_ms: Optional[int] = None
    # The service replica the lease runs, for its host (docs/protocol.md "Services").
    replica: Optional[dict] = None
    # The renter's volumes on the lease, for its host (docs/protocol.md "Volumes").
    volumes: Optional[dict] = None


@dataclass
class JobUpdate(Record):
    """Pushed at every change of one of the account's jobs (docs/protocol.md
    "Jobs"): the job as `job_status` shows it, its `state` the one entered."""

    job: JobInfo


@dataclass
class ServiceUpdate(Record):
    """Pushed at every change of one of the account's services or of one of
    its replicas (docs/protocol.md "Services")."""

    service: ServiceInfo


@dataclass
class ReplicaAssigned(Record):
    """Pushed to a replica lease's host: what to run (an agent's message)."""

    lease: int
    replica: dict


@dataclass
class VolumesAttached(Record):
    """Pushed to a lease's host before its workload: the renter's volumes
    to restore into it, and a store token for them (an agent's message)."""

    lease: int
    renter: int
    volumes: list
    store: Optional[dict] = None


@dataclass
class VolumeUpdate(Record):
    """Pushed to a volume's owner when its storage goes unpaid (with the
    dates it turns read-only and is deleted), is paid up, or the volume is
    deleted for it (docs/storage.md "Prices")."""

    volume: VolumeInfo


@dataclass
class Unknown:
    type: str
    fields: dict

    @property
    def id(self) -> Optional[int]:
        return self.fields.get("id") if isinstance(self.fields, dict) else None


_TYPES = {
    "challenge": Challenge,
    "authenticated": Authenticated,
    "ack": Ack,
    "reject": Reject,
    "error": Error,
    "balance": Balance,
    "book_snapshot": BookSnapshot,
    "book_update": BookUpdate,
    "book_conflated": BookConflated,
    "trade": Trade,
    "delivery": Delivery,
    "lease_delivery": LeaseDelivery,
    "job_update": JobUpdate,
    "service_update": ServiceUpdate,
    "replica_assigned": ReplicaAssigned,
    "volumes_attached": VolumesAttached,
    "volume_update": VolumeUpdate,
}


def parse(message: dict) -> Any:
    """One decoded JSON server message to its dataclass."""
    if not isinstance(message, dict) or len(message) != 1:
        raise ValueError(f"not a gpux message: {message!r}")
    (kind, body), = message.items()
    if kind == "private":
        event = body["event"]
        inner = event["kind"]
        if isinstance(inner, str):
            name, fields = inner, {}
        else:
            (name, fields), = inner.items()
        return Private(seq=event["seq"], at_ms=event["at_ms"], kind=name, fields=fields, reason=body.get("reason"))
    if kind == "market_data":
        return MarketData(messages=[parse(inner) for inner in body["messages"]])
    cls = _TYPES.get(kind) or ANSWERS.get(kind)
    if cls is None:
        return Unknown(kind, body)
    if issubclass(cls, Record):
        return cls.from_wire(body)
    known = {k: v for k, v in body.items() if k in cls.__dataclass_fields__}
    return cls(**known)


def answer_id(message: Any) -> Optional[int]:
    """The request id a parsed message answers, if any."""
    return getattr(message, "id", None)
