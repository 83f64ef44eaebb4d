"""The exchange's REST read API (docs/rest.md): signed `GET`s over HTTP,
with the standard library only.

    >>> rest = gpux.Rest("http://127.0.0.1:7380", key)
    >>> rest.get("/api/v1/account/fills")
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Optional

from .client import GpuxError, Key

REST_DOMAIN = "gpux-rest-v1"


def rest_signed_bytes(method: str, path_and_query: str, timestamp_ms: int) -> bytes:
    """What a REST request's X-Gpux-Signature signs."""
    return f"{REST_DOMAIN}\n{method}\n{path_and_query}\n{timestamp_ms}".encode()


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
            signature = self.key.sign(rest_signed_bytes("GET", path_and_query, timestamp))
            request.add_header("X-Gpux-Key", self.key.public_hex())
            request.add_header("X-Gpux-Timestamp", str(timestamp))
            request.add_header("X-Gpux-Signature", signature.hex())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as refused:
            body = json.loads(refused.read() or b"{}").get("error", {})
            error = GpuxError(body.get("code", "http_error"), body.get("message", str(refused)))
            error.status = refused.code
            raise error from None
