"""The exchange's REST API (docs/rest.md): signed reads and writes over
HTTP, with the standard library only.

    >>> rest = gpux.Rest("http://127.0.0.1:7380", key)
    >>> rest.get("/api/v1/account/fills")
    >>> rest.write("DELETE", "/api/v1/orders/12")
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import urllib.error
import urllib.request
from typing import Any, Optional

from .client import GpuxError, Key

REST_DOMAIN = "gpux-rest-v1"


def rest_signed_bytes(method: str, path_and_query: str, timestamp_ms: int) -> bytes:
    """What a REST request's X-Gpux-Signature signs."""
    return f"{REST_DOMAIN}\n{method}\n{path_and_query}\n{timestamp_ms}".encode()


def rest_signed_write_bytes(method: str, path_and_query: str, timestamp_ms: int, idempotency_key: str, body: bytes) -> bytes:
    """What a REST write's X-Gpux-Signature signs: a read's bytes, then the
    idempotency key and the body's SHA-256 in hex."""
    digest = hashlib.sha256(body).hexdigest()
    return rest_signed_bytes(method, path_and_query, timestamp_ms) + f"\n{idempotency_key}\n{digest}".encode()


# How long `Rest.write` retries a write under its key (docs/rest.md "Writes").
WRITE_RETRY_SECONDS = 10.0


class Rest:
    """A REST client: `base` is the exchange's HTTP address (its
    `--console-listen`); with `key`, every request is signed, so the
    account's paths answer too."""

    def __init__(self, base: str, key: Optional[Key] = None, timeout: float = 10.0):
        self.base = base.rstrip("/")
        self.key = key
        self.timeout = timeout

    def get(self, path_and_query: str) -> Any:
        """The JSON answer to `GET path_and_query`; a refusal raises
        `GpuxError` with the protocol's code (and `.status`, the HTTP status)."""
        request = urllib.request.Request(self.base + path_and_query, method="GET")
        if self.key is not None:
            timestamp = int(time.time() * 1000)
            self._sign(request, rest_signed_bytes("GET", path_and_query, timestamp), timestamp)
        return self._send(request)[0]

    def write(self, method: str, path_and_query: str, body: Optional[dict] = None, idempotency_key: Optional[str] = None) -> Any:
        """A signed write (`POST`, `PUT`, `PATCH` or `DELETE`; docs/rest.md
        "Writes"): the JSON answer, with the whole outcome of the command
        (`journal_seq`, `order`, `events`). The write carries
        `idempotency_key` (a fresh random one when not given) and is sent
        again under it, re-signed, while the exchange answers
        `request_in_progress` or cannot be reached, for
        `WRITE_RETRY_SECONDS`: it is applied once however often it is sent.
        An engine refusal raises `GpuxError` with the reject code and
        `.journal_seq`; any other refusal with the error code. Each raised
        error has `.status`, the HTTP status."""
        if self.key is None:
            raise ValueError("a write is signed: give Rest a key")
        key = idempotency_key or secrets.token_hex(16)
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        deadline = time.monotonic() + WRITE_RETRY_SECONDS
        while True:
            timestamp = int(time.time() * 1000)
            request = urllib.request.Request(self.base + path_and_query, data=data, method=method)
            request.add_header("Content-Type", "application/json")
            request.add_header("Idempotency-Key", key)
            self._sign(request, rest_signed_write_bytes(method, path_and_query, timestamp, key, data), timestamp)
            try:
                return self._send(request)[0]
            except GpuxError as error:
                if error.code != "request_in_progress" or time.monotonic() > deadline:
                    raise
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def _sign(self, request: urllib.request.Request, signed: bytes, timestamp: int) -> None:
        request.add_header("X-Gpux-Key", self.key.public_hex())
        request.add_header("X-Gpux-Timestamp", str(timestamp))
        request.add_header("X-Gpux-Signature", self.key.sign(signed).hex())

    def _send(self, request: urllib.request.Request) -> tuple:
        """The JSON answer and its headers; a refusal raises GpuxError."""
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read()), response.headers
        except urllib.error.HTTPError as refused:
            answer = json.loads(refused.read() or b"{}")
            body = answer.get("error") or answer.get("rejected") or {}
            error = GpuxError(body.get("code", "http_error"), body.get("message", str(refused)))
            error.status = refused.code
            error.journal_seq = body.get("journal_seq")
            raise error from None
