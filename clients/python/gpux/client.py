"""The asyncio client: login, requests answered by id, private events and
market data, and live order books that resync themselves on a sequence gap.

One reader task owns the socket. Answers resolve the future of the request
with the same id; private events go to `events` (an asyncio.Queue); market
data goes to the `Book` objects subscribed to that instrument.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Optional

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives import serialization
from websockets.asyncio.client import connect as ws_connect

from . import answers as a
from . import delivery as d
from . import messages as m

AUTH_DOMAIN = b"gpux-auth-v1:"
# Given several addresses (a cluster's nodes), how long a connection is
# tried again while none accepts (an election); docs/operations.md.
FAILOVER_WINDOW_S = 10.0
LIVENESS_DOMAIN = b"gpux-liveness-v1:"


def _varint(n: int) -> bytes:
    """An unsigned integer in bincode's standard (variable-length) encoding."""
    if n < 251:
        return bytes([n])
    for tag, width in ((0xFB, 2), (0xFC, 4), (0xFD, 8)):
        if n < 1 << (8 * width):
            return bytes([tag]) + n.to_bytes(width, "little")
    raise ValueError(f"{n} does not fit in 64 bits")


def liveness_signed_bytes(lease: int, start_ms: int, end_ms: int, reachable: bool) -> bytes:
    """The bytes a liveness observation's signature covers (docs/protocol.md
    "Liveness observations")."""
    return LIVENESS_DOMAIN + _varint(lease) + _varint(start_ms) + _varint(end_ms) + bytes([1 if reachable else 0])


GPU_PROBE_LINE = "gpux-gpu-probe-v1 "


def gpu_probe_reports(output: str) -> list[dict]:
    """The GPU probe's observations in a lease's output (`lease_logs`): the
    lines `gpux-probe` prints, `gpux-gpu-probe-v1 ` then the report as JSON,
    oldest first; other lines are the workload's own."""
    reports = []
    for line in output.splitlines():
        if line.startswith(GPU_PROBE_LINE):
            try:
                reports.append(json.loads(line[len(GPU_PROBE_LINE):]))
            except json.JSONDecodeError:
                continue
    return reports


INVOICE_DOMAIN = b"gpux-invoice-v1:"


def invoice_signed_bytes(invoice: dict | a.InvoiceDocument) -> bytes:
    """What the exchange signs for an invoice: the domain, then the whole
    invoice as canonical JSON (docs/protocol.md "Invoices")."""
    if isinstance(invoice, a.Record):
        invoice = invoice.to_wire()
    return INVOICE_DOMAIN + json.dumps(invoice, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def verify_invoice(invoice: dict | a.InvoiceDocument, signature: str, public_key: str) -> bool:
    """Whether `signature` is the exchange key `public_key`'s over `invoice`
    (all of its lines): anyone can check an invoice with the published key."""
    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key)).verify(bytes.fromhex(signature), invoice_signed_bytes(invoice))
        return True
    except (InvalidSignature, ValueError):
        return False


class GpuxError(Exception):
    """The exchange refused a request: `code` is the documented stable code;
    `bound`, for a refusal that ran into one, its figures (`tick_minor`,
    `min`, `max`, `needed_minor`, `available_minor`)."""

    def __init__(self, code: str, message: str, bound: Optional[dict] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.bound = bound


class Key:
    """An ed25519 key, stored as 64 hex digits like the CLI's and the agent's."""

    def __init__(self, private: Ed25519PrivateKey):
        self._private = private

    @classmethod
    def generate(cls) -> "Key":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_hex(cls, text: str) -> "Key":
        return cls(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text.strip())))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Key":
        return cls.from_hex(Path(path).expanduser().read_text())

    def secret_hex(self) -> str:
        raw = self._private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
        return raw.hex()

    def public_hex(self) -> str:
        return self._private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()

    def sign(self, data: bytes) -> bytes:
        return self._private.sign(data)


def invite(operator: Key, public_key_hex: str, role: str, expires_at_ms: int) -> str:
    """An operator's invitation for the key `public_key_hex` to open a `role`
    account until `expires_at_ms` (as `gpux invite`): what `Client.connect`
    sends as `invite` to an exchange that opens accounts by invitation
    (docs/operations.md "Opening accounts"). `operator` must be one of the
    exchange's operator keys."""
    if role not in ("renter", "supplier", "aggregator"):
        raise ValueError(f"an invitation opens a renter, supplier or aggregator account, not {role!r}")
    user = bytes.fromhex(public_key_hex)
    if len(user) != 32:
        raise ValueError("a public key is 32 bytes of hex")
    signed = b"gpux-invite-v1:" + user + role.encode() + b":" + int(expires_at_ms).to_bytes(8, "little")
    signature = operator.sign(signed)
    return f"gpux-invite-v1.{role}.{int(expires_at_ms)}.{operator.public_hex()}.{signature.hex()}"


class Book:
    """A level-2 book kept from a snapshot and sequence-numbered updates.

    A gap in the sequence means an update was lost: the book marks itself
    unsynced and the client resubscribes for a fresh snapshot, so a reader
    never sees a wrong book, only briefly an unsynced one.
    """

    def __init__(self, instrument: int):
        self.instrument = instrument
        self.seq = 0
        self.bids: dict[int, int] = {}
        self.asks: dict[int, int] = {}
        self.trades: list[m.Trade] = []
        self.synced = False
        self.resyncs = 0
        self._synced_event = asyncio.Event()
        self._changed = asyncio.Event()

    def apply(self, message: Any) -> bool:
        """Applies one market-data message; False on a sequence gap."""
        if isinstance(message, m.BookSnapshot):
            self.seq = message.seq
            self.bids = {price: qty for price, qty in message.bids}
            self.asks = {price: qty for price, qty in message.asks}
            self.synced = True
            self._synced_event.set()
        elif isinstance(message, (m.BookUpdate, m.BookConflated)) and self.synced:
            # A conflated book (market-data version 2) stands for the updates
            # from_seq to seq: each level's total after them.
            first = message.from_seq if isinstance(message, m.BookConflated) else message.seq
            if message.seq <= self.seq:
                return True  # older than the snapshot: already in it
            if first != self.seq + 1:
                self.synced = False
                self._synced_event.clear()
                return False
            self.seq = message.seq
            if isinstance(message, m.BookConflated):
                changes = [("buy", p, q) for p, q in message.bids] + [("sell", p, q) for p, q in message.asks]
            else:
                changes = [(message.side, message.price_minor_per_gpu_hour, message.quantity)]
            for side, price, quantity in changes:
                levels = self.bids if side == "buy" else self.asks
                if quantity == 0:
                    levels.pop(price, None)
                else:
                    levels[price] = quantity
        elif isinstance(message, m.Trade):
            self.trades.append(message)
            del self.trades[:-100]
        self._changed.set()
        return True

    def best_bid(self) -> Optional[int]:
        return max(self.bids) if self.bids else None

    def best_ask(self) -> Optional[int]:
        return min(self.asks) if self.asks else None

    async def wait_synced(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self._synced_event.wait(), timeout)

    async def wait_for(self, predicate, timeout: float = 10.0) -> None:
        """Waits until `predicate(book)` holds."""

        async def loop():
            while not (self.synced and predicate(self)):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)


def store_bases(url: str) -> list[str]:
    """The base URLs a job store token's `url` names: one, or a cluster's
    nodes, comma-separated (docs/protocol.md "The job store")."""
    return [base.strip().rstrip("/") for base in url.split(",") if base.strip()]


async def _store_request(method: str, url: str, path: str, token: str, body: Optional[bytes] = None) -> bytes:
    """One job store request (urllib, in a thread) to the first of the
    token's base URLs that answers (one that cannot be reached, a node
    down, is passed over; an HTTP status is the store's answer); its error
    body's code as GpuxError."""
    import urllib.error
    import urllib.request

    def call(base: str) -> bytes:
        request = urllib.request.Request(base + path, data=body, method=method, headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=600) as answer:
                return answer.read()
        except urllib.error.HTTPError as error:
            try:
                detail = json.loads(error.read())
            except ValueError:
                detail = {"code": f"http_{error.code}", "message": str(error)}
            raise GpuxError(detail.get("code", f"http_{error.code}"), detail.get("message", "")) from None

    unreachable: Optional[Exception] = None
    for base in store_bases(url):
        try:
            return await asyncio.to_thread(call, base)
        except (urllib.error.URLError, ConnectionError) as error:
            # Not reached, or cut before an answer: the next node.
            unreachable = error
    raise GpuxError("store_unreachable", f"no job store address answered ({url}): {unreachable}")


def pack_bundle(directory: str | Path) -> bytes:
    """A code directory packed as the CLI packs it (`gpux.bundle.pack`: the
    same ignore rules, symbolic links refused, the same bytes and so the
    same SHA-256 name); raises `gpux.bundle.BundleError` as the CLI refuses."""
    from . import bundle

    return bundle.pack(directory)


class Client:
    """One session with the exchange. Use `await Client.connect(...)`."""

    def __init__(self, socket, account: Optional[int], role: Optional[str], clock_offset_ms: int):
        self._socket = socket
        self.account = account
        self.role = role
        self.clock_offset_ms = clock_offset_ms
        self._next_id = 1
        self._pending: dict[int, asyncio.Future] = {}
        self._books: dict[int, Book] = {}
        self.events: asyncio.Queue = asyncio.Queue()
        # The last delivery status pushed for each lease the account rents.
        self.deliveries: dict[int, m.Delivery] = {}
        self._delivery_changed = asyncio.Event()
        # The newest state of each of the account's jobs seen on this connection.
        self.jobs_seen: dict[int, a.JobInfo] = {}
        self._job_changed = asyncio.Event()
        self.services_seen: dict[int, a.ServiceInfo] = {}
        self._service_changed = asyncio.Event()
        self._reader: Optional[asyncio.Task] = None
        self._key: Optional[Key] = None
        # Set once the connection closed: what every request then raises.
        self.closed: Optional[GpuxError] = None
        self._url = ""
        self._reconnect = False
        self._closing = False
        self._connected = asyncio.Event()
        # How many times the connection was opened again after a drop.
        self.reconnects = 0

    @classmethod
    async def connect(
        cls, url: str, key: Optional[Key] = None, role: Optional[str] = None, reconnect: bool = False, invite: Optional[str] = None
    ) -> "Client":
        """Connects and logs in with `key` (`role` opens an account for a new
        key; `invite` is the operator's invitation an exchange that opens
        accounts by invitation needs for that: `gpux invite`); without a key
        the session sees public market data only. A first login it refuses
        raises GpuxError with `invite_required`, `invite_invalid`,
        `too_many_accounts` or `rate_limited`. `url`
        may name several addresses, comma-separated (a cluster's nodes): the
        first that accepts is used, and a reconnect tries them all again.

        With `reconnect`, a connection that drops (the exchange restarts, the
        network fails) is opened again with backoff: the client logs in
        again with its key and resubscribes its books (each resyncs from a
        fresh snapshot). Requests in flight when it dropped fail with the
        close reason; resend them once `wait_connected()` returns (orders:
        with the same client_order_id, which the exchange refuses twice). A
        key that was revoked or expired is not retried."""
        socket, account, actual_role, offset = await cls._open(url, key, role, invite)
        client = cls(socket, account, actual_role, offset)
        client._key = key
        client._url = url
        client._reconnect = reconnect
        client._reader = asyncio.create_task(client._run())
        return client

    @staticmethod
    async def _open(url: str, key: Optional[Key], role: Optional[str], invite: Optional[str] = None):
        # Several comma-separated addresses (a cluster's nodes): the first
        # that accepts (only the leader does).
        urls = [u.strip() for u in url.split(",") if u.strip()]
        if not urls:
            raise GpuxError("connect", "no exchange address given")
        # With several, a pass where none accepts (an election: the old
        # leader stopped serving, the new one not yet) is tried again for up
        # to FAILOVER_WINDOW_S; one address fails at once.
        deadline = asyncio.get_running_loop().time() + FAILOVER_WINDOW_S
        socket = None
        while socket is None:
            for index, each in enumerate(urls):
                try:
                    socket = await ws_connect(each, max_size=1 << 20)
                    break
                except OSError:
                    last = index == len(urls) - 1
                    if last and (len(urls) == 1 or asyncio.get_running_loop().time() >= deadline):
                        raise
            if socket is None:
                await asyncio.sleep(0.25)
        challenge = m.parse(json.loads(await socket.recv()))
        if not isinstance(challenge, m.Challenge):
            raise GpuxError("protocol", f"expected a challenge, got {challenge!r}")
        offset = challenge.server_time_ms - m._now_ms()
        account, actual_role = None, None
        if key is None:
            # Market-data version 2 without a login too (see below).
            await socket.send(json.dumps({"market_data_version": {"id": 1, "version": 2}}))
            answer = m.parse(json.loads(await socket.recv()))
            if isinstance(answer, m.Error):
                await socket.close()
                raise GpuxError(answer.code, answer.message)
        if key is not None:
            signature = key.sign(AUTH_DOMAIN + bytes.fromhex(challenge.nonce))
            # Market-data version 2: feed messages batched, a book this
            # client falls behind on conflated instead of resent whole.
            auth = {"auth": {"id": 1, "public_key": key.public_hex(), "signature": signature.hex(), "role": role, "market_data_version": 2}}
            if invite is not None:
                auth["auth"]["invite"] = invite
            await socket.send(json.dumps(auth))
            while True:
                answer = m.parse(json.loads(await socket.recv()))
                if isinstance(answer, m.Authenticated):
                    account, actual_role = answer.account, answer.role
                    break
                if isinstance(answer, m.Error):
                    await socket.close()
                    raise GpuxError(answer.code, answer.message)
        return socket, account, actual_role, offset

    # Close reasons after which reconnecting cannot help.
    _FINAL = ("key_revoked", "key_expired", "auth_failed", "invite_required", "invite_invalid", "too_many_accounts")

    async def _run(self) -> None:
        """Reads until the connection closes; with `reconnect`, opens it
        again (backoff 0.2 s doubling to 5 s) and goes on."""
        while True:
            await self._read()
            if not self._reconnect or self._closing or (self.closed is not None and self.closed.code in self._FINAL):
                return
            delay = 0.2
            while True:
                await asyncio.sleep(delay)
                try:
                    socket, account, _, offset = await self._open(self._url, self._key, None)
                except GpuxError as refused:
                    if refused.code in self._FINAL:
                        self.closed = refused
                        return
                    delay = min(delay * 2, 5.0)
                    continue
                except OSError:
                    delay = min(delay * 2, 5.0)
                    continue
                except Exception:
                    delay = min(delay * 2, 5.0)
                    continue
                break
            self._socket, self.clock_offset_ms = socket, offset
            if account is not None:
                self.account = account
            self.closed = None
            self.reconnects += 1
            # Every book resyncs from a fresh snapshot on the new connection.
            for book in self._books.values():
                book.synced = False
                book._synced_event.clear()
                for channel in ("book", "trades"):
                    self._next_id += 1
                    answer = asyncio.get_running_loop().create_future()
                    # Nobody awaits these answers: a drop's error is read here.
                    answer.add_done_callback(lambda f: f.cancelled() or f.exception())
                    self._pending[self._next_id] = answer
                    await self._socket.send(json.dumps({"subscribe": {"id": self._next_id, "channel": channel, "instrument": book.instrument}}))
            self._connected.set()

    async def wait_connected(self, timeout: float = 30.0) -> None:
        """Returns once the connection is open (again, after a drop)."""
        async def loop():
            while self.closed is not None:
                self._connected.clear()
                await self._connected.wait()

        await asyncio.wait_for(loop(), timeout)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        self._closing = True
        if self._reader:
            self._reader.cancel()
        await self._socket.close()

    async def _dispatch(self, message: Any) -> None:
        request = m.answer_id(message)
        if request is not None and request in self._pending:
            future = self._pending.pop(request)
            if not future.done():
                future.set_result(message)
        elif isinstance(message, m.Delivery):
            self.deliveries[message.lease] = message
            self._delivery_changed.set()
        elif isinstance(message, m.JobUpdate):
            self.jobs_seen[message.job.job] = message.job
            self._job_changed.set()
        elif isinstance(message, m.ServiceUpdate):
            self.services_seen[message.service.service] = message.service
            self._service_changed.set()
        elif isinstance(message, (m.BookSnapshot, m.BookUpdate, m.BookConflated, m.Trade)):
            book = self._books.get(message.instrument)
            if book is not None and not book.apply(message):
                asyncio.create_task(self.resync(book))
        else:
            await self.events.put(message)

    async def _read(self) -> None:
        try:
            async for frame in self._socket:
                message = m.parse(json.loads(frame))
                for each in message.messages if isinstance(message, m.MarketData) else (message,):
                    await self._dispatch(each)
        except asyncio.CancelledError:
            raise
        except Exception:  # the connection broke
            pass
        # Closed, cleanly or not: whoever waits, and every later request,
        # fails with the exchange's close reason as the code (`key_revoked`,
        # `slow_consumer`, ...; `connection_closed` without one).
        reason = getattr(self._socket, "close_reason", None) or "connection_closed"
        self.closed = GpuxError(reason, f"the exchange closed the connection ({reason})")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self.closed)
        self._pending.clear()

    async def request(self, kind: str, **fields: Any) -> Any:
        """Sends `{kind: {id, **fields}}` and returns the parsed answer;
        raises GpuxError on a reject or gateway error."""
        if self.closed is not None:
            raise self.closed
        self._next_id += 1
        request_id = self._next_id
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._socket.send(json.dumps({kind: {"id": request_id, **fields}}))
            answer = await asyncio.wait_for(future, 30)
        except (GpuxError, asyncio.TimeoutError):
            raise
        except Exception as error:
            # The socket closed under the request: the close reason says why
            # (the reader sets it as it sees the close).
            await asyncio.sleep(0)
            raise (self.closed or GpuxError("connection_closed", str(error))) from error
        finally:
            self._pending.pop(request_id, None)
        if isinstance(answer, m.Reject):
            raise GpuxError(answer.code, answer.message, answer.bound)
        if isinstance(answer, m.Error):
            raise GpuxError(answer.code, answer.message)
        return answer

    # --- requests ------------------------------------------------------------

    async def place(self, order: m.OrderTicket, workload: Optional[d.Workload] = None) -> m.Ack:
        """Places an order; a bid's `workload` goes to every lease it fills
        (with secrets, set `secrets_follow` and call `set_workload` with them
        for each lease: the bid cannot know its hosts)."""
        return await self.request("new_order", order=order.to_wire(), workload=workload.to_wire() if workload else None)

    async def cancel(self, order: int) -> m.Ack:
        return await self.request("cancel_order", order=order)

    async def replace(self, order: int, price: int, quantity: int) -> m.Ack:
        return await self.request("replace_order", order=order, price_minor_per_gpu_hour=price, quantity=quantity)

    async def cancel_all(self, instrument: Optional[int] = None) -> m.Ack:
        return await self.request("mass_cancel", instrument=instrument)

    async def balance(self) -> m.Balance:
        return await self.request("balance")

    async def deposit(self, account: int, amount_minor: int) -> m.Ack:
        return await self.request("deposit", account=account, amount_minor=amount_minor)

    async def withdraw(self, amount_minor: int, account: Optional[int] = None) -> m.Ack:
        """Moves available funds out (the operator names `account`)."""
        return await self.request("withdraw", account=account, amount_minor=amount_minor)

    async def payout(self, amount_minor: int, account: Optional[int] = None) -> m.Ack:
        """Pays a supplier's earnings out (the operator names `account`)."""
        return await self.request("payout", account=account, amount_minor=amount_minor)

    async def statement(self) -> list[a.StatementLine]:
        """Every ledger transfer of the account, oldest first (all pages)."""
        lines: list[a.StatementLine] = []
        after = None
        while True:
            page: a.Statement = await self.request("statement", after=after)
            lines += page.lines
            if page.next_after is None:
                return lines
            after = page.next_after

    # --- sub-accounts and keys (docs/protocol.md "Sub-accounts", "Keys and scopes")

    async def open_sub_account(self) -> int:
        """Opens a sub-account under this account; returns its account id."""
        opened: a.SubAccountOpened = await self.request("open_sub_account")
        return opened.account

    async def move_funds(self, sub_account: int, amount_minor: int, to_sub_account: bool = True) -> m.Ack:
        """Moves available funds to a sub-account (or back with `to_sub_account=False`)."""
        return await self.request("move_funds", sub_account=sub_account, amount_minor=amount_minor, to_sub_account=to_sub_account)

    async def set_sub_account_limits(
        self,
        sub_account: int,
        max_open_orders: Optional[int] = None,
        max_order_minor: Optional[int] = None,
        max_held_minor: Optional[int] = None,
    ) -> m.Ack:
        """Replaces every limit of a sub-account (None: no limit)."""
        limits = {"max_open_orders": max_open_orders, "max_order_minor": max_order_minor, "max_held_minor": max_held_minor}
        return await self.request("set_sub_account_limits", sub_account=sub_account, limits=limits)

    async def sub_accounts(self) -> list[a.SubAccount]:
        """This account's sub-accounts with balances, open orders and limits (all pages)."""
        subs: list[a.SubAccount] = []
        offset = 0
        while True:
            page: a.SubAccounts = await self.request("sub_accounts", offset=offset)
            subs += page.sub_accounts
            if page.next_offset is None:
                return subs
            offset = page.next_offset

    async def add_key(
        self,
        public_key: str,
        scopes: list[str],
        account: Optional[int] = None,
        expires_at_ms: Optional[int] = None,
        label: str = "",
    ) -> a.KeyAdded:
        """Lets another key act as this account (or sub-account `account`)
        with `scopes` (read, trade, deliver, withdraw, manage)."""
        return await self.request(
            "add_key", account=account, public_key=public_key, scopes=scopes, expires_at_ms=expires_at_ms, label=label
        )

    async def revoke_key(self, public_key: str) -> a.KeyRevoked:
        """Revokes a key; its open sessions are closed at once."""
        return await self.request("revoke_key", public_key=public_key)

    async def keys(self, account: Optional[int] = None) -> list[a.KeyInfo]:
        """The keys of this account (or of sub-account `account`), owner key first."""
        answer: a.Keys = await self.request("keys", account=account)
        return answer.keys

    async def lease_telemetry(self, lease: int) -> list[a.GpuTelemetry]:
        """Each GPU of a lease (you rent or supply) with its latest usage
        reports' measurements, oldest first (`gpu_uuid`, `samples`)."""
        answer: a.LeaseTelemetry = await self.request("lease_telemetry", lease=lease)
        return answer.gpus

    async def ping(self) -> int:
        """The exchange's clock now (ms since the epoch), answered `pong`."""
        pong: a.Pong = await self.request("ping")
        return pong.server_time_ms

    async def exchange_key(self) -> str:
        """The exchange's public key (hex), which signs invoices."""
        answer: a.ExchangeKey = await self.request("exchange_key")
        return answer.public_key

    async def invoice(self, period: str, account: Optional[int] = None) -> a.SignedInvoice:
        """The signed invoice for a closed month `YYYY-MM` (of sub-account
        `account`), every page put together and its signature checked
        against the exchange's published key (GpuxError `invoice_forged`
        if it does not verify)."""
        return await self._signed_document(lambda offset: self.request("invoice", period=period, account=account, offset=offset))

    async def _signed_document(self, page_at) -> a.SignedInvoice:
        """Every page of an `invoice` answer (`page_at(offset)`) put together,
        its signature checked against the exchange's published key."""
        published = await self.exchange_key()
        lines: list[a.InvoiceLine] = []
        offset = 0
        while True:
            page: a.InvoicePage = await page_at(offset)
            lines += page.invoice.lines
            if page.next_offset is None:
                break
            offset = page.next_offset
        document = page.invoice
        document.lines = lines
        if page.exchange_key != published or not verify_invoice(document, page.signature, published):
            raise GpuxError("invoice_forged", f"{document.number} does not verify with the exchange's key {published}")
        return a.SignedInvoice(document, page.signature, published)

    # Services (docs/services.md, docs/protocol.md "Services").

    async def create_service(self, spec: dict, floor: dict | None = None) -> a.ServiceInfo:
        """Creates a service (the fields of `create_service`: name,
        instrument, gpus, limit_minor_per_gpu_hour, budget_minor_per_hour,
        replicas, min_replicas, max_replicas, image, command, port,
        readiness_path, regions, scaling, key_hashes; `service_key_hash`
        makes a key's hash); returns it as it stands. `floor`
        ({instrument, replicas, limit_minor_per_gpu_hour}) keeps that many
        replicas on a spot book while the rest run on the spec's
        preemptible book. Bad fields raise GpuxError `service_invalid`
        naming the field."""
        return (await self.request("create_service", service=spec, floor=floor)).service

    async def service(self, service: int) -> a.ServiceInfo:
        """One of the account's services: its state and replicas."""
        return (await self.request("service_status", service=service)).service

    async def services(self) -> list[a.ServiceInfo]:
        """Every service of the account the exchange keeps, newest first."""
        found: list[a.ServiceInfo] = []
        offset = 0
        while True:
            page: a.Services = await self.request("services", offset=offset)
            found += page.services
            if page.next_offset is None:
                return found
            offset = page.next_offset

    async def scale_service(self, service: int, replicas: int) -> a.ServiceInfo:
        """Sets how many replicas the service keeps."""
        return (await self.request("scale_service", service=service, replicas=replicas)).service

    async def update_service(self, service: int, run: dict) -> a.ServiceInfo:
        """Rolls out a new run ({image, command, port, readiness_path}) one
        replica at a time (docs/services.md "Updates")."""
        return (await self.request("update_service", service=service, run=run)).service

    async def delete_service(self, service: int) -> a.ServiceInfo:
        """Deletes a service: its bids cancelled, its replicas' leases ended."""
        return (await self.request("delete_service", service=service)).service

    async def service_bill(self, service: int) -> a.SignedInvoice:
        """The service's bill so far (every lease its replicas ran on:
        usage, fees and credits), every page, its signature checked."""
        return await self._signed_document(lambda offset: self.request("service_bill", service=service, offset=offset))

    async def service_load(self, service: int, router: int, requests_per_second_milli: int, in_flight: int, queued: int) -> m.Ack:
        """A router's load of a service over the last second (what
        `gpux-router` reports; a service without `scaling` refuses it)."""
        load = {"requests_per_second_milli": requests_per_second_milli, "in_flight": in_flight, "queued": queued}
        return await self.request("service_load", service=service, router=router, load=load)

    async def wait_service(self, service: int, predicate, timeout: float = 120.0) -> a.ServiceInfo:
        """Waits until `predicate(service)` holds for the service's pushed
        `service_update`s (or its state now); returns it."""

        async def loop():
            self.services_seen.setdefault(service, await self.service(service))
            while True:
                info = self.services_seen.get(service)
                if info is not None and predicate(info):
                    return info
                self._service_changed.clear()
                await self._service_changed.wait()

        return await asyncio.wait_for(loop(), timeout)

    # Jobs (docs/jobs.md, docs/protocol.md "Jobs").

    async def submit_job(self, job: dict) -> a.JobInfo:
        """Submits a job (the fields of `submit_job`: name, instrument, gpus,
        one_host, limit_minor_per_gpu_hour, hours, budget_minor, retries,
        run {image, command, bundle, ...}; and for a job on several hosts of
        one fabric, nodes and min_fabric_gbps: docs/jobs.md "Clusters";
        restarts_on_error, alternatives [{instrument,
        limit_minor_per_gpu_hour}] and regions: "Retries" and "Failover");
        returns the job as it stands. Bad fields raise GpuxError
        `job_invalid` naming the field."""
        return (await self.request("submit_job", job=job)).job

    async def job(self, job: int) -> a.JobInfo:
        """One of the account's jobs: state, attempts, leases, escrow."""
        return (await self.request("job_status", job=job)).job

    async def jobs(self) -> list[a.JobInfo]:
        """Every job of the account the exchange keeps, newest first."""
        found: list[a.JobInfo] = []
        offset = 0
        while True:
            page: a.Jobs = await self.request("jobs", offset=offset)
            found += page.jobs
            if page.next_offset is None:
                return found
            offset = page.next_offset

    async def resize_job(self, job: int, gpus: int) -> a.JobInfo:
        """Grows (or shrinks) a running job to `gpus`: the new size is bought
        first, then the job restarts there from its checkpoint."""
        return (await self.request("resize_job", job=job, gpus=gpus)).job

    async def cancel_job(self, job: int) -> a.JobInfo:
        """Cancels a job: its bid is cancelled or its leases ended."""
        return (await self.request("cancel_job", job=job)).job

    async def wait_job(self, job: int, until=("succeeded", "failed", "cancelled"), timeout: float = 120.0) -> a.JobInfo:
        """Waits until the job's state is one of `until` (its pushed
        `job_update`s, or its state now); returns the job."""

        async def loop():
            known = await self.job(job)
            self.jobs_seen.setdefault(job, known)
            while True:
                info = self.jobs_seen.get(job)
                if info is not None and info.state_name in until:
                    return info
                self._job_changed.clear()
                await self._job_changed.wait()

        return await asyncio.wait_for(loop(), timeout)

    async def job_store_token(self) -> a.JobStoreToken:
        """A bearer token for the account's prefix of the job store
        (docs/protocol.md "The job store")."""
        return await self.request("job_store_token")

    async def create_volume(self, name: str, size_gib: int) -> a.VolumeInfo:
        """Creates a volume: a named folder of at most `size_gib` GiB in the
        job store, mounted into leases with an order's `volumes`
        (docs/storage.md). Bad names or sizes raise GpuxError `volume_invalid`."""
        return (await self.request("create_volume", name=name, size_gib=size_gib)).volume

    async def volumes(self) -> list[a.VolumeInfo]:
        """The account's volumes, by name."""
        return (await self.request("volumes")).volumes

    async def delete_volume(self, name: str) -> a.VolumeInfo:
        """Deletes a volume no lease or bid holds (else GpuxError
        `volume_in_use`): its files leave the store."""
        return (await self.request("delete_volume", name=name)).volume

    async def volume_token(self, name: str) -> a.JobStoreToken:
        """The account's bearer token for volume `name` in the store: read
        and write its files (`<account>/volumes/<volume>/<path>`)."""
        return await self.request("job_store_token", volume=name)

    async def put_volume_file(self, name: str, path: str, body: bytes) -> None:
        """Puts `body` at `path` in volume `name` (what `gpux volume cp` does)."""
        volume = next((v for v in await self.volumes() if v.name == name), None)
        if volume is None:
            raise GpuxError("unknown_volume", f"no volume called {name}")
        token = await self.volume_token(name)
        key = f"{volume.owner}/volumes/{volume.volume}/{path.strip('/')}"
        await _store_request("PUT", token.url, f"/v1/objects/{key}", token.token, body)

    async def volume_files(self, name: str) -> dict:
        """Volume `name`'s files by their path in it, with their content."""
        volume = next((v for v in await self.volumes() if v.name == name), None)
        if volume is None:
            raise GpuxError("unknown_volume", f"no volume called {name}")
        token = await self.volume_token(name)
        prefix = f"{volume.owner}/volumes/{volume.volume}"
        listed = json.loads(await _store_request("GET", token.url, f"/v1/list/{prefix}", token.token))
        return {item["key"][len(prefix) + 1 :]: await _store_request("GET", token.url, f"/v1/objects/{item['key']}", token.token) for item in listed}

    async def put_bundle(self, bundle: bytes) -> dict:
        """Puts a code bundle (a gzip-compressed tar, `pack_bundle`) in the
        job store under its SHA-256; returns the `bundle` field of a job's run."""
        import hashlib

        sha256 = hashlib.sha256(bundle).hexdigest()
        token = await self.job_store_token()
        key = f"{self.account}/bundles/{sha256}.tar.gz"
        await _store_request("PUT", token.url, f"/v1/objects/{key}", token.token, bundle)
        return {"sha256": sha256, "bytes": len(bundle)}

    async def put_input(self, packed: bytes) -> dict:
        """Puts a packed input directory (`gpux.bundle.pack_input`) in the job store;
        returns the `source` of a job's input (`{"store": {...}}`)."""
        import hashlib

        sha256 = hashlib.sha256(packed).hexdigest()
        token = await self.job_store_token()
        await _store_request("PUT", token.url, f"/v1/objects/{self.account}/inputs/{sha256}.tar.gz", token.token, packed)
        return {"store": {"sha256": sha256, "bytes": len(packed)}}

    async def job_results(self, job: int, to: str | Path, checkpoints: bool = False) -> list[str]:
        """Downloads the job's outputs (and checkpoints) from the job store
        into `to`; returns the paths written, relative to `to`."""
        token = await self.job_store_token()
        written = []
        for area in ["outputs"] + (["checkpoints"] if checkpoints else []):
            prefix = f"{self.account}/jobs/{job}/"
            listed = json.loads(await _store_request("GET", token.url, f"/v1/list/{prefix}{area}", token.token))
            for item in listed:
                relative = item["key"][len(prefix):]
                if any(part in ("", ".", "..") for part in relative.split("/")):
                    continue
                data = await _store_request("GET", token.url, f"/v1/objects/{item['key']}", token.token)
                path = Path(to) / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                written.append(relative)
        return written

    async def job_logs(self, job: int, attempt: Optional[int] = None, tail_bytes: int = 16384) -> dict[int, str]:
        """The job's output by rank: live from the running attempt's host,
        or, once the job ended (or for `attempt`), the tails its hosts kept
        in the job store (`logs/attempt-<A>-rank-<R>.log`, the newest
        attempt's unless `attempt` is given)."""
        info = await self.job(job)
        running = info.state.get("running") if isinstance(info.state, dict) else None
        if attempt is None and running is not None:
            leases = running["leases"]
            return {rank: await self.lease_logs(lease, tail_bytes) for rank, lease in enumerate(leases)}
        token = await self.job_store_token()
        prefix = f"{self.account}/jobs/{job}/logs"
        listed = json.loads(await _store_request("GET", token.url, f"/v1/list/{prefix}", token.token))
        kept: dict[int, dict[int, str]] = {}
        for item in listed:
            name = item["key"].rsplit("/", 1)[-1]
            if not (name.startswith("attempt-") and name.endswith(".log") and "-rank-" in name):
                continue
            number, rank = name[len("attempt-") : -len(".log")].split("-rank-", 1)
            if number.isdigit() and rank.isdigit():
                kept.setdefault(int(number), {})[int(rank)] = item["key"]
        wanted = attempt if attempt is not None else max(kept, default=None)
        if wanted is None or wanted not in kept:
            return {}
        return {
            rank: (await _store_request("GET", token.url, f"/v1/objects/{key}", token.token)).decode("utf-8", "replace")
            for rank, key in sorted(kept[wanted].items())
        }

    async def job_bill(self, job: int) -> a.SignedInvoice:
        """The job's bill so far (its leases' usage, fees and credits), every
        page put together and its signature checked like an invoice's."""
        return await self._signed_document(lambda offset: self.request("job_bill", job=job, offset=offset))

    async def offer_lease(self, lease: int, price: int, time_in_force: str = "gtc", client_order_id: Optional[int] = None) -> m.Ack:
        """Offers what is left of a fixed-duration spot lease, whole, on its
        class's resale book (docs/market-rules.md "Lease resale"); buyers bid
        on CLASS/RESALE with `duration={"hours": N}`."""
        return await self.request(
            "offer_lease",
            lease=lease,
            price_minor_per_gpu_hour=price,
            client_order_id=client_order_id if client_order_id is not None else m._now_ms(),
            time_in_force=time_in_force,
        )

    async def recent_statement(self, before: Optional[int] = None) -> a.RecentStatement:
        """One page of the account's transfers, newest first (before transfer
        id `before`): `lines`, and `next_before` for the next (older) page."""
        return await self.request("recent_statement", before=before)

    async def set_spend_limits(
        self, daily_minor: Optional[int] = None, total_minor: Optional[int] = None, max_held_minor: Optional[int] = None
    ) -> m.Ack:
        """Replaces the account's own spend limits (None: no limit; all None
        removes them); bids past one are refused `spend_limit`."""
        limits = {"daily_minor": daily_minor, "total_minor": total_minor, "max_held_minor": max_held_minor}
        return await self.request("set_spend_limits", limits=limits)

    async def spend(self) -> Optional[a.Spend]:
        """The account's spend limits and what they count (None without limits)."""
        answer: a.SpendAnswer = await self.request("spend")
        return answer.spend

    async def end_lease(self, lease: int) -> m.Ack:
        return await self.request("end_lease", lease=lease)

    async def register_gpu(
        self,
        host: str,
        gpu_uuid: str,
        spec: dict,
        region: Optional[str] = None,
        zone: Optional[str] = None,
        fabric: Optional[dict] = None,
    ) -> m.Ack:
        """Lists a GPU of a host (the supplier agent does this from NVML).
        `region` (one of the listing's) and `zone` are declared by the host's
        first GPU that names a region, and kept (docs/market-rules.md "Regions").
        `fabric` ({group, gbps, address, port_base}) declares the fabric that
        joins the host to the supplier's others in its zone, for cluster bids
        (docs/market-rules.md "Cluster bids")."""
        return await self.request("register_gpu", host=host, gpu_uuid=gpu_uuid, spec=spec, region=region, zone=zone, fabric=fabric)

    async def listing(self) -> a.Listing:
        """The listing the exchange runs (public): currency, regions, fees,
        classes with their SLA, calendar and challenge."""
        answer: a.ListingAnswer = await self.request("listing")
        return answer.listing

    async def currency(self) -> m.Currency:
        """The exchange's currency, to read and write amounts in."""
        currency = (await self.listing()).currency
        return m.Currency(currency.code, currency.decimals)

    async def set_gpu_online(self, gpu: int, online: bool) -> m.Ack:
        return await self.request("set_gpu_online", gpu=gpu, online=online)

    async def my_gpus(self) -> list[a.Gpu]:
        """The account's registered GPUs (all pages)."""
        gpus: list[a.Gpu] = []
        offset = 0
        while True:
            page: a.Gpus = await self.request("my_gpus", offset=offset)
            gpus += page.gpus
            if page.next_offset is None:
                return gpus
            offset = page.next_offset

    async def stats(self, instrument: int) -> a.Stats:
        """An instrument's last 24 hours: open, high, low, last, volume, trades."""
        return await self.request("stats", instrument=instrument)

    async def instruments(self) -> list[a.Instrument]:
        """Every instrument the exchange lists (public)."""
        answer: a.Instruments = await self.request("instruments")
        return answer.instruments

    async def instrument(self, symbol: str) -> a.Instrument:
        """The instrument of `symbol` (`CLASS/CONTRACT`, e.g.
        "H100-SXM-80G/SPOT"); GpuxError `unknown_instrument` if the
        exchange lists none by that name."""
        for each in await self.instruments():
            if each.symbol == symbol:
                return each
        raise GpuxError("unknown_instrument", f"the exchange lists no instrument {symbol}")

    async def supplier_stats(self, supplier: int) -> a.SupplierStats:
        """A supplier's reliability (public): `record` (score_bps, None while
        unrated, and its facts) over `window_days`, and each host's."""
        return await self.request("supplier_stats", supplier=supplier)

    async def book_offers(self, instrument: int) -> list[a.BookOffer]:
        """Every ask in the instrument's book, best first, each with its
        seller, the seller's score and how many of its GPUs are verified
        (public). Pages follow the book's cursor (`next_after`), so asks
        that leave while it reads move no other past a page's edge."""
        offers: list[a.BookOffer] = []
        after = None
        while True:
            page: a.BookOffers = await self.request("book_offers", instrument=instrument, after=after)
            offers += page.offers
            if page.next_after is None:
                return offers
            after = page.next_after

    async def search(
        self,
        *,
        min_gpu_memory_gb: int = 0,
        min_gpus: int = 0,
        vendor: Optional[str] = None,
        max_price_minor_per_gpu_hour: Optional[int] = None,
        regions: tuple[str, ...] | list[str] = (),
        min_score_bps: int = 0,
        verified_only: bool = False,
        contracts: tuple[str, ...] | list[str] = (),
        fabric_only: bool = False,
        sort: str = "price",
        limit: int = 100,
    ) -> list[a.FoundOffer]:
        """Every book's cheapest asks at once that fit, in `sort` order
        (`price`, `price_per_gb` or `price_per_tflops`), at most `limit`
        (public; docs/protocol.md "Search"). `contracts` names `spot`,
        `preemptible`, `reserved`, `resale`."""
        search: dict[str, Any] = {
            "min_gpu_memory_gb": min_gpu_memory_gb,
            "min_gpus": min_gpus,
            "vendor": vendor,
            "max_price_minor_per_gpu_hour": max_price_minor_per_gpu_hour,
            "regions": list(regions),
            "min_score_bps": min_score_bps,
            "verified_only": verified_only,
            "contracts": list(contracts),
            "fabric_only": fabric_only,
            "sort": sort,
        }
        found: list[a.FoundOffer] = []
        while len(found) < limit:
            search["limit"] = min(limit - len(found), 100)
            page: a.OffersFound = await self.request("search_offers", search=search)
            found += page.offers
            if page.next_after is None:
                break
            search["after"] = page.next_after
        return found[:limit]

    async def book_once(self, instrument: int) -> a.BookLevels:
        """An instrument's book now, once, without following it (public;
        `book()` follows it live): `seq`, `bids` and `asks` as
        `[price, quantity]` levels, best first."""
        return await self.request("book", instrument=instrument)

    async def trades(self, instrument: int, before_seq: Optional[int] = None) -> a.Trades:
        """One page of an instrument's trades, newest first (public), and
        `next_before_seq` for the next (older) page."""
        return await self.request("trades", instrument=instrument, before_seq=before_seq)

    async def candles(self, instrument: int, interval: str = "1h", before_ms: Optional[int] = None) -> a.Candles:
        """Price candles of `interval` (`1m`, `1h` or `1d`), oldest first
        (public), and `next_before_ms` while older ones exist."""
        return await self.request("candles", instrument=instrument, interval=interval, before_ms=before_ms)

    async def fills(self, before: Optional[dict] = None) -> a.Fills:
        """One page of the account's fills, newest first: `fills` and
        `next_before` (pass it as `before` for the next, older page)."""
        return await self.request("fills", before=before)

    async def renter_stats(self, renter: int) -> a.RenterRecord:
        """An account's record as a renter (public): liveness observations
        it signed, time signed unreachable, disputes raised."""
        answer: a.RenterStats = await self.request("renter_stats", renter=renter)
        return answer.record

    def exchange_now_ms(self) -> int:
        """The exchange's clock, as measured at login."""
        return m._now_ms() + self.clock_offset_ms

    async def liveness(self, lease: int, start_ms: int, end_ms: int, reachable: bool) -> m.Ack:
        """Signs and sends what this renter saw of its lease's endpoint over
        `[start_ms, end_ms)` (exchange time): reported time it signed
        unreachable is disputed (docs/market-rules.md "Disputes")."""
        if self._key is None:
            raise GpuxError("not_authenticated", "liveness is signed with the login key")
        signature = self._key.sign(liveness_signed_bytes(lease, start_ms, end_ms, reachable))
        body = {"lease": lease, "start_ms": start_ms, "end_ms": end_ms, "reachable": reachable}
        return await self.request("liveness", report={"body": body, "signature": signature.hex()})

    async def gpu_probe(self, report: dict) -> m.Ack:
        """Sends one observation of this renter's GPU probe as the probe
        printed it (signed by the probe's own key, docs/protocol.md "GPU
        probe"): time the probe saw a GPU absent that its host reported
        available is disputed and proven (docs/market-rules.md "Disputes")."""
        return await self.request("gpu_probe", report=report)

    async def open_orders(self) -> list[a.Order]:
        """Every open order, by order id, following the pages' cursor (an
        order that closes meanwhile moves no other past the reader)."""
        return await self._every_page(lambda after: self.request("open_orders", after=after), "orders")

    async def leases(self) -> list[a.Lease]:
        """Every lease the account rents or supplies, newest first."""
        return await self._every_page(lambda after: self.request("leases", after=after), "leases")

    @staticmethod
    async def _every_page(ask, items: str) -> list:
        rows: list = []
        after = None
        while True:
            page = await ask(after)
            rows += getattr(page, items)
            if page.next_after is None:
                return rows
            after = page.next_after

    # --- lease delivery ------------------------------------------------------

    async def host_key(self, lease: int) -> bytes:
        """The leased host's X25519 key, checked against its identity key's
        signature (GpuxError `encryption_key_invalid` if it does not verify)."""
        answer = await self.request("host_key", lease=lease)
        try:
            return d.verified_host_key(answer.to_wire())
        except ValueError as error:
            raise GpuxError("encryption_key_invalid", str(error)) from error

    async def set_workload(self, lease: int, workload: d.Workload, secrets: Optional[d.Secrets] = None) -> m.Ack:
        """Sets (or replaces) a lease's workload; `secrets` are sealed to the
        lease's host after checking its key."""
        if secrets is not None:
            workload.sealed = secrets.seal(await self.host_key(lease))
            workload.secrets_follow = False
        return await self.request("set_workload", lease=lease, workload=workload.to_wire())

    async def lease_delivery(self, lease: int) -> m.LeaseDelivery:
        """A lease's workload (public part) and its host's last status."""
        return await self.request("lease_delivery", lease=lease)

    async def lease_logs(self, lease: int, tail_bytes: int = 16384) -> str:
        """The last `tail_bytes` of the workload's output, from the host."""
        logs: a.LeaseLogs = await self.request("lease_logs", lease=lease, tail_bytes=tail_bytes)
        return logs.data

    async def lease_exec(self, lease: int, command: list[str], timeout_ms: int = 30_000) -> a.ExecOutcome:
        """Runs `command` in the lease's running workload through its host
        (no SSH): its exit code and output (docs/protocol.md "Exec")."""
        answer: a.LeaseExec = await self.request("lease_exec", lease=lease, command=list(command), timeout_ms=timeout_ms)
        return answer.outcome

    async def wait_delivery(self, lease: int, states=("running",), timeout: float = 120.0) -> m.Delivery:
        """Waits for a lease's delivery to reach one of `states`; raises
        GpuxError with the failure code if it fails first, and with code
        "exited" (or "stopped") if the workload exits (or is removed) before
        reaching them: the lease of a workload that exited is still billed."""
        known = await self.lease_delivery(lease)
        if known.state is not None and lease not in self.deliveries:
            self.deliveries[lease] = m.Delivery(lease, known.state, known.at_ms or 0)

        async def loop():
            while True:
                self._delivery_changed.clear()
                latest = self.deliveries.get(lease)
                name = d.state_name(latest.state) if latest else None
                if name in states:
                    return latest
                if name == "failed":
                    fields = d.state_fields(latest.state)
                    raise GpuxError(fields["code"], fields["reason"])
                if name == "exited":
                    code = d.state_fields(latest.state)["code"]
                    raise GpuxError("exited", f"the workload exited with code {code}; lease {lease} is still active and billed")
                if name == "stopped":
                    raise GpuxError("stopped", f"lease {lease}'s workload was stopped and removed")
                await self._delivery_changed.wait()

        return await asyncio.wait_for(loop(), timeout)

    async def book(self, instrument: int) -> Book:
        """Subscribes to an instrument's book and trades; returns the live book."""
        book = self._books.get(instrument)
        if book is None:
            book = Book(instrument)
            self._books[instrument] = book
            await self.request("subscribe", channel="book", instrument=instrument)
            await self.request("subscribe", channel="trades", instrument=instrument)
        return book

    async def resync(self, book: Book) -> None:
        """Drops the book's state and asks for a fresh snapshot (after a gap)."""
        book.resyncs += 1
        await self.request("unsubscribe", channel="book", instrument=book.instrument)
        await self.request("subscribe", channel="book", instrument=book.instrument)

    async def next_event(self, timeout: float = 10.0) -> m.Private:
        """The next private event (fills, leases, notices, funds)."""
        while True:
            message = await asyncio.wait_for(self.events.get(), timeout)
            if isinstance(message, m.Private):
                return message
