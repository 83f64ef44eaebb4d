"""The exchange's answers as typed records (docs/protocol.md).

Every answer the client reads is a dataclass here, built by
`Record.from_wire` from the JSON object the exchange sent: fields by name,
nested objects and lists of them as their own records (from the
annotations), a JSON field that is a Python keyword (`from`, `class`) under
the name with `_` after it. A field this client does not know yet (a newer
exchange) is kept in `extra`, never dropped, and `to_wire()` gives back the
object the exchange sent, which is what a signature covers (an invoice's).

Money is in integer minor units of the exchange's currency; times are
milliseconds since the Unix epoch.
"""

from __future__ import annotations

import functools
import keyword
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Optional, Union


class Record:
    """A JSON object from the exchange as a dataclass (subclasses are
    dataclasses)."""

    @classmethod
    def from_wire(cls, body: dict) -> Any:
        hints = _hints(cls)
        known: dict[str, Any] = {}
        names = set()
        for each in fields(cls):
            wire = _wire_name(each.name)
            names.add(wire)
            if wire in body:
                known[each.name] = _from_wire(hints[each.name], body[wire])
            elif each.default is MISSING and each.default_factory is MISSING:
                known[each.name] = None  # an older exchange's answer, without it
        record = cls(**known)
        object.__setattr__(record, "_extra", {key: value for key, value in body.items() if key not in names})
        return record

    @property
    def extra(self) -> dict:
        """Fields the exchange sent that this client does not model."""
        return getattr(self, "_extra", {})

    def to_wire(self) -> dict:
        """The JSON object this record was read from."""
        body = {_wire_name(each.name): _to_wire(getattr(self, each.name)) for each in fields(self)}
        body.update(self.extra)
        return body


def _wire_name(name: str) -> str:
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _from_wire(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is Union:
        inner = [each for each in typing.get_args(hint) if each is not type(None)]
        return _from_wire(inner[0], value) if len(inner) == 1 else value
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(hint)
        return [_from_wire(item, each) for each in value]
    if isinstance(hint, type) and issubclass(hint, Record) and isinstance(value, dict):
        return hint.from_wire(value)
    return value


def _to_wire(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_wire()
    if isinstance(value, list):
        return [_to_wire(each) for each in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {_wire_name(each.name): _to_wire(getattr(value, each.name)) for each in fields(value)}
    return value


# --- the market ------------------------------------------------------------------


@dataclass
class Instrument(Record):
    """A book: its symbol (`CLASS/CONTRACT`), state and price rules."""

    instrument: int
    symbol: str
    class_: str
    contract: str  # spot | preemptible | reserved | resale
    state: Any  # "trading", "halted", ... as docs/protocol.md names them
    tick_minor: int
    price_min_minor_per_gpu_hour: int
    price_max_minor_per_gpu_hour: int


@dataclass
class Instruments(Record):
    id: int
    instruments: list[Instrument]


@dataclass
class Stats(Record):
    """An instrument's last 24 hours (prices None before any trade)."""

    id: int
    instrument: int
    window_start_ms: int
    open: Optional[int]
    high: Optional[int]
    low: Optional[int]
    last: Optional[int]
    volume: int
    trades: int


@dataclass
class BookLevels(Record):
    """`book`: an instrument's book once, `[price, quantity]` levels best first."""

    id: int
    instrument: int
    seq: int
    bids: list
    asks: list


@dataclass
class FabricProbe(Record):
    """The last interconnect probe of a fabric (docs/market-rules.md "Cluster bids")."""

    at_ms: int
    lease: int
    ranks: int
    mbps: int
    borne_out: bool


@dataclass
class Fabric(Record):
    """The fabric a host declared: its name, zone, bandwidth per host, hosts on it."""

    name: str
    zone: str
    gbps: int
    hosts: int
    probe: Optional[FabricProbe]


@dataclass
class BookOffer(Record):
    """One ask in a book with its seller's record."""

    price_minor_per_gpu_hour: int
    quantity: int
    supplier: int
    host: Optional[int]
    gpus_verified: int
    supplier_score_bps: Optional[int]  # None while unrated
    region: Optional[str]
    fabric: Optional[Fabric]


@dataclass
class BookOffers(Record):
    id: int
    instrument: int
    offers: list[BookOffer]
    next_offset: Optional[int]
    next_after: Optional[dict]  # {price_minor_per_gpu_hour, priority}


@dataclass
class FoundOffer(Record):
    """One ask `search` found, with what it sells (docs/protocol.md "Search")."""

    instrument: int
    symbol: str
    class_: str
    contract: Any  # "spot", "preemptible", "lease_resale" or {"reserved": {...}}
    price_minor_per_gpu_hour: int
    quantity: int
    supplier: int
    host: Optional[int]
    vendor: str
    model: str
    gpu_memory_mib: int
    gpus_verified: int
    supplier_score_bps: Optional[int]
    region: Optional[str]
    fabric: Optional[Fabric]
    measured_gflops: Optional[int]  # TFLOPS x 1000 its GPUs' challenges measured (the least)
    price_minor_per_gb_hour: int
    price_minor_per_tflops_hour: Optional[int]
    place: dict  # {key, instrument, priority}


@dataclass
class OffersFound(Record):
    id: int
    offers: list[FoundOffer]
    next_after: Optional[dict]


@dataclass
class PastTrade(Record):
    """One trade of `trades`' history."""

    seq: int
    at_ms: int
    price_minor_per_gpu_hour: int
    quantity: int
    aggressor: str


@dataclass
class Trades(Record):
    """A page of an instrument's trades, newest first."""

    id: int
    instrument: int
    trades: list[PastTrade]
    next_before_seq: Optional[int]


@dataclass
class Candle(Record):
    start_ms: int
    open: int
    high: int
    low: int
    close: int
    volume: int
    trades: int


@dataclass
class Candles(Record):
    """A page of price candles, oldest first."""

    id: int
    instrument: int
    interval: str
    candles: list[Candle]
    next_before_ms: Optional[int]


@dataclass
class Fill(Record):
    """One of the account's fills."""

    instrument: int
    seq: int
    at_ms: int
    side: str
    order: int
    price_minor_per_gpu_hour: int
    quantity: int
    liquidity: str  # maker | taker


@dataclass
class Fills(Record):
    """A page of the account's fills, newest first; pass `next_before` on."""

    id: int
    fills: list[Fill]
    next_before: Optional[dict]


@dataclass
class ListingClass(Record):
    """A GPU class of the listing: what qualifies, its prices, SLA and challenges."""

    name: str
    requirement: dict
    tick_minor: int
    price_min_minor_per_gpu_hour: int
    price_max_minor_per_gpu_hour: int
    preemption_notice_ms: int
    calendar: dict
    sla_availability_bps: int
    challenge: Optional[dict]
    sla_credit_tiers: list
    memory_challenge: Optional[dict]


@dataclass
class ListingCurrency(Record):
    code: str
    decimals: int


@dataclass
class Listing(Record):
    """The listing the exchange runs (`listing`'s `listing`)."""

    classes: list[ListingClass]
    prepaid_horizon_hours: int
    market_protection_bps: int
    orders_per_account_max: int
    accounts_max: int
    fee_bps: int
    billing_grace_ms: int
    currency: ListingCurrency
    regions: list


@dataclass
class ListingAnswer(Record):
    id: int
    listing: Listing
    cluster_rules: list  # [{class, min_fabric_gbps}]


# --- suppliers and renters ---------------------------------------------------------


@dataclass
class GpuSpec(Record):
    vendor: str
    model: str
    memory_mib: int
    interconnect: str
    mig_profile: Optional[str]


@dataclass
class ComputeCheck(Record):
    """A GPU's last hardware challenge."""

    at_ms: int
    outcome: str  # passed | too_slow | failed | unanswered
    mflops: Optional[int]
    rejected: bool


@dataclass
class MemoryCheck(Record):
    """A GPU's last memory challenge."""

    at_ms: int
    outcome: str
    mbps: Optional[int]


@dataclass
class Gpu(Record):
    """A registered GPU (`my_gpus`)."""

    gpu: int
    uuid: str
    host: int
    host_name: str
    index_on_host: int
    owner: int
    spec: GpuSpec
    classes: list
    online: bool
    verified: bool
    challenge: Optional[ComputeCheck]
    memory: Optional[MemoryCheck]
    region: Optional[str]
    zone: str
    fabric: Optional[Fabric]


@dataclass
class Gpus(Record):
    id: int
    gpus: list[Gpu]
    next_offset: Optional[int]


@dataclass
class ReliabilityRecord(Record):
    """A supplier's (or host's) record over the window; `score_bps` None while unrated."""

    score_bps: Optional[int]
    leased_gpu_ms: int
    verified_gpu_ms: int
    leases_closed: int
    failed_deliveries: int
    refused_reports: dict  # refusal code -> count
    disputes: int
    disputed_gpu_ms: int
    disconnects_during_leases: int
    preemptions_late: int
    challenges_passed: int
    challenges_too_slow: int
    challenges_failed: int
    challenges_unanswered: int
    failed_deliveries_in_row: int


@dataclass
class HostRecord(Record):
    host: int
    host_name: str
    record: ReliabilityRecord


@dataclass
class SupplierStats(Record):
    id: int
    supplier: int
    window_days: int
    record: ReliabilityRecord
    hosts: list[HostRecord]
    hosts_more: bool


@dataclass
class RenterRecord(Record):
    """A renter's liveness observations, time signed unreachable and disputes."""

    observations: int
    unreachable_ms: int
    disputes: int
    disputed_gpu_ms: int


@dataclass
class RenterStats(Record):
    id: int
    renter: int
    record: RenterRecord


# --- the account -------------------------------------------------------------------


@dataclass
class Order(Record):
    """One open order (`open_orders`)."""

    order: int
    account: int
    client_order_id: int
    instrument: int
    side: str
    price_minor_per_gpu_hour: int
    quantity: int
    resting: bool
    regions: list
    supply: Optional[dict]  # {host, gpu_mask} on a GPU owner's ask
    nodes: int


@dataclass
class Orders(Record):
    id: int
    orders: list[Order]
    next_after: Optional[int]


@dataclass
class Lease(Record):
    """A lease the account rents or supplies."""

    lease: int
    kind: str  # spot | preemptible | reserved
    renter: int
    supplier: int
    gpus: list
    price_minor_per_gpu_hour: int
    start_ms: int
    end_ms: Optional[int]  # None: until cancelled
    active: bool
    ended_at_ms: Optional[int]
    escrow_minor: int
    billing_closed: bool
    verified_gpu_ms: int
    usage_charged_minor: int


@dataclass
class Leases(Record):
    id: int
    leases: list[Lease]
    next_after: Optional[int]


@dataclass
class LeaseReplaced(Record):
    """Pushed when a rematching bid's lease failed: its replacement (None: none found)."""

    lease: int
    replacement: Optional[int]


@dataclass
class HostKey(Record):
    """A leased host's X25519 key and its identity key's signature over it."""

    id: int
    lease: int
    encryption_key: str
    identity_key: str
    signature: str


@dataclass
class LeaseLogs(Record):
    id: int
    lease: int
    data: str
    truncated: bool


@dataclass
class ExecOutcome(Record):
    """What a command run in a workload did (`lease_exec`): its exit code
    (None past its timeout or when nothing ran), the last of its output,
    and why the host ran nothing (`refused`)."""

    exit_code: Optional[int]
    output: str
    truncated: bool
    timed_out: bool
    refused: Optional[str]


@dataclass
class LeaseExec(Record):
    id: int
    lease: int
    outcome: ExecOutcome


@dataclass
class TelemetrySample(Record):
    """What one usage report measured of a GPU (the last two None without readings)."""

    start_ms: int
    end_ms: int
    available_ms: int
    utilisation_percent: int
    memory_used_mib_max: int
    unhealthy_samples: int
    temperature_c_max: Optional[int]
    power_w_mean: Optional[int]


@dataclass
class GpuTelemetry(Record):
    gpu_uuid: str
    samples: list[TelemetrySample]


@dataclass
class LeaseTelemetry(Record):
    id: int
    lease: int
    gpus: list[GpuTelemetry]


@dataclass
class StatementLine(Record):
    """One ledger transfer touching the account (`from_` is the wire's `from`)."""

    transfer: int
    at_ms: int
    from_: str
    to: str
    amount_minor: int
    lease: Optional[int]
    kind: str
    description: str


@dataclass
class Statement(Record):
    """A page of the account's transfers, oldest first."""

    id: int
    lines: list[StatementLine]
    next_after: Optional[int]


@dataclass
class RecentStatement(Record):
    """A page of the account's transfers, newest first; pass `next_before` on."""

    id: int
    lines: list[StatementLine]
    next_before: Optional[int]


@dataclass
class SpendLimits(Record):
    daily_minor: Optional[int]
    total_minor: Optional[int]
    max_held_minor: Optional[int]


@dataclass
class Spend(Record):
    """The account's own spend limits and what they count."""

    limits: SpendLimits
    spent_today_minor: int
    spent_total_minor: int
    held_minor: int


@dataclass
class SpendAnswer(Record):
    id: int
    spend: Optional[Spend]


@dataclass
class Pong(Record):
    id: int
    server_time_ms: int


@dataclass
class MarketDataVersion(Record):
    id: int
    version: int


@dataclass
class SubAccountOpened(Record):
    id: int
    journal_seq: int
    account: int


@dataclass
class Balances(Record):
    available_minor: int
    held_minor: int
    payable_minor: int
    debt_minor: int


@dataclass
class SubAccountLimits(Record):
    max_open_orders: Optional[int]
    max_order_minor: Optional[int]
    max_held_minor: Optional[int]


@dataclass
class SubAccount(Record):
    account: int
    balances: Balances
    open_orders: int
    limits: SubAccountLimits


@dataclass
class SubAccounts(Record):
    id: int
    sub_accounts: list[SubAccount]
    next_offset: Optional[int]


@dataclass
class KeyAdded(Record):
    id: int
    journal_seq: int
    public_key: str
    account: int


@dataclass
class KeyRevoked(Record):
    id: int
    journal_seq: int
    public_key: str


@dataclass
class KeyInfo(Record):
    """A key that may act as the account, with its scopes."""

    public_key: str
    account: int
    scopes: list
    owner: bool
    expires_at_ms: Optional[int]
    label: str
    added_at_ms: int


@dataclass
class Keys(Record):
    id: int
    account: int
    keys: list[KeyInfo]


@dataclass
class InvoiceLine(Record):
    lease: int
    instrument: str
    item: str  # usage | fee | sla_credit | ...
    price_minor_per_gpu_hour: int
    verified_gpu_ms: int
    amount_minor: int  # negative for a credit


@dataclass
class InvoiceTotals(Record):
    charges_minor: int
    credits_minor: int
    amount_due_minor: int
    deposits_minor: int
    withdrawals_minor: int
    payouts_minor: int
    moved_in_minor: int
    moved_out_minor: int


@dataclass
class InvoiceDocument(Record):
    """An invoice (or a job's bill) as the exchange signs it."""

    number: str
    issuer: str
    account: int
    parent: Optional[int]
    period: str
    period_start_ms: int
    period_end_ms: int
    currency: str
    minor_per_unit: int
    lines: list[InvoiceLine]
    totals: InvoiceTotals
    tax: Optional[dict]


@dataclass
class InvoicePage(Record):
    """One page of `invoice` (or `job_bill`): the document with this page's lines."""

    id: int
    invoice: InvoiceDocument
    line_count: int
    next_offset: Optional[int]
    signature: str
    exchange_key: str


@dataclass
class SignedInvoice:
    """An invoice with every page's lines, checked against the exchange's key."""

    invoice: InvoiceDocument
    signature: str
    exchange_key: str


@dataclass
class ExchangeKey(Record):
    id: int
    public_key: str


@dataclass
class Subscribed(Record):
    id: int
    channel: str
    instrument: Optional[int]


@dataclass
class Unsubscribed(Record):
    id: int
    channel: str
    instrument: Optional[int]


# --- jobs ---------------------------------------------------------------------------


@dataclass
class JobRun(Record):
    """What a job runs (docs/jobs.md)."""

    image: str
    command: list
    bundle: Optional[dict] = None  # {sha256, bytes}
    install: list = field(default_factory=list)
    checkpoint_dir: str = ""
    outputs_dir: str = ""
    checkpoint_interval_s: int = 0
    shm_mib: int = 0
    inputs: list = field(default_factory=list)


@dataclass
class JobInfo(Record):
    """A job as it stands: `state` is its wire form ("succeeded", or
    {"running": {"attempt", "leases"}}, ...), `state_name` its name."""

    job: int
    name: str
    instrument: int
    gpus: int
    state: Any
    attempts: int
    retries: int
    escrowed_minor: int
    budget_minor: int
    leases: list
    submitted_at_ms: int
    updated_at_ms: int
    run: JobRun
    # Restarts after the workload's errors: allowed, used (docs/jobs.md "Retries").
    restarts_on_error: int = 0
    restarts: int = 0
    # Other books new attempts may bid on: [{instrument, limit_minor_per_gpu_hour}] ("Failover").
    alternatives: list = field(default_factory=list)
    regions: list = field(default_factory=list)
    # The latest move to a new attempt: {attempt, cause, instrument, choice, at_ms}.
    last_move: Any = None
    # A preemption known to be coming: {lease, notice_at_ms, ends_at_ms} ("Preemption").
    preemption_ahead: Any = None

    @property
    def state_name(self) -> str:
        return self.state if isinstance(self.state, str) else next(iter(self.state))

    @property
    def state_fields(self) -> Any:
        return None if isinstance(self.state, str) else next(iter(self.state.values()))


@dataclass
class Job(Record):
    id: int
    job: JobInfo


@dataclass
class Jobs(Record):
    id: int
    jobs: list[JobInfo]
    next_offset: Optional[int]


@dataclass
class JobStoreToken(Record):
    """A bearer token for the account's prefix of the job store."""

    id: int
    url: str
    token: str
    expires_at_ms: int


@dataclass
class ServiceInfo(Record):
    """A service as it stands (docs/services.md): `spec` as created (or
    updated), `state` (running, failed, bids_exhausted, deleted), its
    replicas ({slot, state, lease, endpoint, stalled, since_ms,
    generation, noticed}), bids placed and replicas replaced, the leases it
    ran on, the autoscaler's `last_scaling`, the latest update's `rollout`
    and its `floor` of spot replicas, if any."""

    service: int
    spec: dict
    state: str
    replicas: list
    bids: int
    replaced: int
    leases: list
    created_at_ms: int
    updated_at_ms: int
    last_scaling: Any = None
    generation: int = 0
    rollout: Optional[str] = None
    floor: Optional[dict] = None

    def ready(self) -> list:
        """The replicas ready to serve."""
        return [replica for replica in self.replicas if replica.get("state") == "ready"]


@dataclass
class Service(Record):
    id: int
    service: ServiceInfo


@dataclass
class Services(Record):
    id: int
    services: list[ServiceInfo]
    next_offset: Optional[int]


@dataclass
class VolumeInfo(Record):
    """A volume (docs/storage.md): its name and size, `state` (ready or
    deleted), the lease writing it (`writer`), a resting bid claiming it
    (`writer_bid`) and the leases reading a copy (`readers`)."""

    volume: int
    owner: int
    name: str
    size_gib: int
    state: str
    created_at_ms: int
    writer: Optional[int]
    writer_bid: Optional[int]
    readers: list
    # Its storage charged since the price in force, and, while its
    # account's storage is unpaid, the funds rule's dates (docs/storage.md "Prices").
    unpaid_since_ms: Optional[int] = None
    read_only_from_ms: Optional[int] = None
    delete_from_ms: Optional[int] = None
    charged_minor: int = 0


@dataclass
class Volume(Record):
    id: int
    volume: VolumeInfo


@dataclass
class Volumes(Record):
    id: int
    volumes: list[VolumeInfo]


# The answers `gpux.parse` reads into these records, by wire type.
ANSWERS = {
    "instruments": Instruments,
    "stats": Stats,
    "book": BookLevels,
    "book_offers": BookOffers,
    "offers_found": OffersFound,
    "trades": Trades,
    "candles": Candles,
    "fills": Fills,
    "listing": ListingAnswer,
    "gpus": Gpus,
    "supplier_stats": SupplierStats,
    "renter_stats": RenterStats,
    "orders": Orders,
    "leases": Leases,
    "lease_replaced": LeaseReplaced,
    "host_key": HostKey,
    "lease_logs": LeaseLogs,
    "lease_exec": LeaseExec,
    "lease_telemetry": LeaseTelemetry,
    "statement": Statement,
    "recent_statement": RecentStatement,
    "spend": SpendAnswer,
    "pong": Pong,
    "market_data_version": MarketDataVersion,
    "sub_account_opened": SubAccountOpened,
    "sub_accounts": SubAccounts,
    "key_added": KeyAdded,
    "key_revoked": KeyRevoked,
    "keys": Keys,
    "invoice": InvoicePage,
    "exchange_key": ExchangeKey,
    "subscribed": Subscribed,
    "unsubscribed": Unsubscribed,
    "job": Job,
    "jobs": Jobs,
    "job_store_token": JobStoreToken,
    "service": Service,
    "services": Services,
    "volume": Volume,
    "volumes": Volumes,
}
