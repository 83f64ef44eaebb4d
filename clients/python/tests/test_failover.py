"""A client given a cluster's addresses waits out an election (docs/operations.md
"What clients see on a failure"): while no node accepts, it tries again for
up to `FAILOVER_WINDOW_S`; with one address it fails at once. The node that
wins here is a stand-in that listens late and sends a login challenge."""

import asyncio
import json
import socket
import time

import pytest
import websockets

from gpux.client import Client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_several_addresses_wait_out_an_election_and_one_fails_at_once():
    async def scenario():
        old_leader, new_leader = free_port(), free_port()

        async def challenge(ws):
            await ws.send(json.dumps({"challenge": {"nonce": "ab" * 32, "server_time_ms": int(time.time() * 1000)}}))
            # A session without a key asks for market-data version 2 first.
            request = json.loads(await ws.recv())
            await ws.send(json.dumps({"market_data_version": request["market_data_version"]}))
            await ws.wait_closed()

        async def late_node():
            await asyncio.sleep(1.5)
            async with websockets.serve(challenge, "127.0.0.1", new_leader):
                await asyncio.sleep(10)

        node = asyncio.create_task(late_node())
        started = time.monotonic()
        opened = await Client._open(f"ws://127.0.0.1:{old_leader},ws://127.0.0.1:{new_leader}", None, None)
        assert time.monotonic() - started >= 1.4, "it waited for the election"
        await opened[0].close()
        node.cancel()

        started = time.monotonic()
        with pytest.raises(OSError):
            await Client._open(f"ws://127.0.0.1:{free_port()}", None, None)
        assert time.monotonic() - started < 1.0, "one address fails at once"

    asyncio.run(scenario())


def test_a_job_store_request_passes_over_a_node_that_cannot_be_reached():
    """A token's url lists a cluster's stores (docs/protocol.md "The job
    store"): the first here refuses connections, the second answers; a
    status is the store's answer and is not tried elsewhere; with no
    address answering the error says so."""
    import http.server
    import threading

    from gpux.client import GpuxError, _store_request, store_bases

    seen = []

    class Store(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):
            seen.append((self.path, self.headers["Authorization"], self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):
            body = json.dumps({"code": "not_found", "message": "no such object"}).encode()
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dead, alive = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{server.server_address[1]}"
        url = f"{dead}, {alive}/"
        assert store_bases(url) == [dead, alive]
        asyncio.run(_store_request("PUT", url, "/v1/objects/7/bundles/x.tar.gz", "tok", b"code"))
        assert seen == [("/v1/objects/7/bundles/x.tar.gz", "Bearer tok", b"code")]
        with pytest.raises(GpuxError) as answered:
            asyncio.run(_store_request("GET", url, "/v1/objects/7/missing", "tok"))
        assert answered.value.code == "not_found"
        with pytest.raises(GpuxError) as unreachable:
            asyncio.run(_store_request("GET", dead, "/v1/objects/7/missing", "tok"))
        assert unreachable.value.code == "store_unreachable"
    finally:
        server.shutdown()
