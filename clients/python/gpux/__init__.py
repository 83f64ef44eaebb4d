"""gpux: Python client for the gpux GPU-capacity exchange (docs/protocol.md)."""

from .client import Book, Client, GpuxError, Key
from .messages import (
    A100_PREEMPT,
    A100_SPOT,
    H100_PREEMPT,
    H100_SPOT,
    Ack,
    Balance,
    BookSnapshot,
    BookUpdate,
    Error,
    OrderTicket,
    Private,
    Reject,
    Trade,
    dollars,
    parse,
)

__all__ = [
    "A100_PREEMPT",
    "A100_SPOT",
    "Ack",
    "Balance",
    "Book",
    "BookSnapshot",
    "BookUpdate",
    "Client",
    "Error",
    "GpuxError",
    "H100_PREEMPT",
    "H100_SPOT",
    "Key",
    "OrderTicket",
    "Private",
    "Reject",
    "Trade",
    "dollars",
    "parse",
]
