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
