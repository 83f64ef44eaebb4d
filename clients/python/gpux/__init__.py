"""gpux: Python client for the gpux GPU-capacity exchange (docs/protocol.md).

Answers are typed records (`gpux.answers`: `Lease`, `StatementLine`,
`JobInfo`, ...). Instruments are found by symbol (`Client.instrument(
"H100-SXM-80G/SPOT")`): an exchange's listing decides their ids."""

from . import answers
from .answers import Record
from .client import Book, Client, GpuxError, Key, gpu_probe_reports, invite, invoice_signed_bytes, pack_bundle, verify_invoice
from .delivery import Secrets, Workload, describe
from .rest import Rest, rest_signed_bytes, rest_signed_write_bytes


def service_key_hash(key: str) -> str:
    """The hex SHA-256 of a service key: what a service's `key_hashes`
    holds (routers accept `Authorization: Bearer KEY`)."""
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()
from .messages import (
    Ack,
    AmountError,
    Balance,
    BookConflated,
    BookSnapshot,
    BookUpdate,
    Currency,
    Delivery,
    Error,
    LeaseDelivery,
    OrderTicket,
    JobUpdate,
    MarketData,
    Private,
    Reject,
    ServiceUpdate,
    Trade,
    dollars,
    parse,
)

__all__ = [
    "Record",
    "answers",
    "Ack",
    "AmountError",
    "Balance",
    "Book",
    "BookConflated",
    "BookSnapshot",
    "BookUpdate",
    "Currency",
    "Client",
    "Delivery",
    "Error",
    "GpuxError",
    "JobUpdate",
    "ServiceUpdate",
    "service_key_hash",
    "Key",
    "LeaseDelivery",
    "MarketData",
    "OrderTicket",
    "Private",
    "Rest",
    "Reject",
    "Secrets",
    "Trade",
    "Workload",
    "describe",
    "gpu_probe_reports",
    "invite",
    "invoice_signed_bytes",
    "pack_bundle",
    "verify_invoice",
    "dollars",
    "parse",
    "rest_signed_bytes",
    "rest_signed_write_bytes",
]
