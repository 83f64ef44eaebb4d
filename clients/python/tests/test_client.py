"""The Python client against the real gpux-exchange binary over a real socket.

Each test starts its own exchange (a temporary data directory, a free port,
an operator key made for the test) and speaks only the documented protocol.
"""

import asyncio
import calendar
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import gpux

ROOT = Path(__file__).resolve().parents[3]
EXCHANGE = Path(os.environ.get("GPUX_EXCHANGE_BIN", ROOT / "target" / "debug" / "gpux-exchange"))
# The demo listing's books these tests trade (EngineConfig::demo; a client
# finds an exchange's own by symbol, `Client.instrument`).
H100_SPOT = 0
sys.path.insert(0, str(ROOT / "clients" / "python" / "examples"))


def without_id(record: gpux.Record) -> dict:
    return {name: value for name, value in record.to_wire().items() if name != "id"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def exchange():
    """A running exchange: yields (url, operator key)."""
    assert EXCHANGE.exists(), f"build the exchange first: cargo build -p gpux-exchange ({EXCHANGE})"
    operator = gpux.Key.generate()
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        process = subprocess.Popen(
            [str(EXCHANGE), "--data-dir", data, "--listen", f"127.0.0.1:{port}", "--metrics-listen", "off", "--console-listen", "off",
             "--operator-key", operator.public_hex()],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            deadline = time.time() + 30
            for line in process.stdout:
                if "listening on" in line:
                    break
                assert time.time() < deadline, "the exchange did not start"
            yield f"ws://127.0.0.1:{port}", operator
        finally:
            process.terminate()
            process.wait(timeout=10)


import contextlib


@contextlib.contextmanager
def exchange_on(data: str, operator, port: int, extra=()):
    """The exchange binary on a given data directory and port."""
    process = subprocess.Popen(
        [str(EXCHANGE), "--data-dir", data, "--listen", f"127.0.0.1:{port}", "--metrics-listen", "off", "--console-listen", "off",
         "--operator-key", operator.public_hex(), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        for line in process.stdout:
            if "listening on" in line:
                break
        yield f"ws://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def run(coroutine):
    return asyncio.run(coroutine)


async def funded_renter(url, operator, amount="1000"):
    renter = await gpux.Client.connect(url, gpux.Key.generate(), role="renter")
    async with await gpux.Client.connect(url, operator, role="operator") as op:
        await op.deposit(renter.account, gpux.dollars(amount))
    return renter


async def supplier_with_gpus(url, count=1, role="supplier", key=None):
    supplier = await gpux.Client.connect(url, key or gpux.Key.generate(), role=role)
    spec = {"vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link", "mig_profile": None}
    for index in range(count):
        await supplier.request("register_gpu", host=f"py-host-{supplier.account}", gpu_uuid=f"GPU-py-{supplier.account}-{index}", spec=spec)
    gpus = (await supplier.request("my_gpus")).gpus
    return supplier, gpus[0].host


def test_login_opens_an_account_and_refusals_carry_their_stable_code(exchange):
    url, _ = exchange

    async def scenario():
        async with await gpux.Client.connect(url, gpux.Key.generate(), role="renter") as renter:
            assert renter.account is not None and renter.role == "renter"
            balance = await renter.balance()
            assert (balance.available_minor, balance.held_minor, balance.debt_minor) == (0, 0, 0)
            with pytest.raises(gpux.GpuxError) as off_tick:
                await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", 2_000_500, 1))
            assert off_tick.value.code == "price_off_tick"
            assert off_tick.value.bound["tick_minor"] == 1_000, "the bound it ran into"
            with pytest.raises(gpux.GpuxError) as unfunded:
                await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("2"), 1))
            assert unfunded.value.code == "insufficient_funds"
            assert (unfunded.value.bound["needed_minor"], unfunded.value.bound["available_minor"]) == (2_000_000, 0)
            with pytest.raises(gpux.GpuxError) as unknown:
                await renter.place(gpux.OrderTicket.limit(999, "buy", gpux.dollars("2"), 1))
            assert unknown.value.code == "unknown_instrument"
            # A request the gateway cannot decode is answered with its id:
            # the code comes at once, not a 30 s timeout.
            started = time.monotonic()
            with pytest.raises(gpux.GpuxError) as malformed:
                await renter.request("cancel_order")
            assert malformed.value.code == "wrong_type" and time.monotonic() - started < 5
            assert (await renter.balance()).available_minor == 0, "the session is still sound"
        async with await gpux.Client.connect(url) as anonymous:
            assert any(i.symbol == "H100-SXM-80G/SPOT" for i in await anonymous.instruments()), "market data is public"
            spot = await anonymous.instrument("H100-SXM-80G/SPOT")
            assert (spot.instrument, spot.class_, spot.contract) == (H100_SPOT, "H100-SXM-80G", "spot"), spot
            with pytest.raises(gpux.GpuxError) as unlisted:
                await anonymous.instrument("H100-SXM-80G/FUTURE")
            assert unlisted.value.code == "unknown_instrument"
            with pytest.raises(gpux.GpuxError) as private:
                await anonymous.balance()
            assert private.value.code == "not_authenticated"

    run(scenario())


def test_an_invited_key_opens_its_account_and_refusals_name_their_cause():
    operator = gpux.Key.generate()
    with tempfile.TemporaryDirectory() as data, exchange_on(data, operator, free_port(), ["--account-opening", "invite"]) as url:

        async def scenario():
            user = gpux.Key.generate()
            with pytest.raises(gpux.GpuxError) as uninvited:
                await gpux.Client.connect(url, user, role="renter")
            assert uninvited.value.code == "invite_required"
            later = int(time.time() * 1000) + 60_000
            with pytest.raises(gpux.GpuxError) as forged:
                await gpux.Client.connect(url, user, role="renter", invite=gpux.invite(gpux.Key.generate(), user.public_hex(), "renter", later))
            assert forged.value.code == "invite_invalid"
            invitation = gpux.invite(operator, user.public_hex(), "renter", later)
            async with await gpux.Client.connect(url, user, role="renter", invite=invitation) as renter:
                assert renter.role == "renter"
            async with await gpux.Client.connect(url, user) as again:
                assert again.account == renter.account, "a known key logs in without an invitation"

        run(scenario())


def test_several_addresses_connect_to_the_first_that_accepts(exchange):
    """A cluster's nodes, comma-separated: nodes that refuse (followers, or
    dead) are skipped; with none accepting, the connection error is raised."""
    url, _ = exchange
    dead = f"ws://127.0.0.1:{free_port()}"

    async def scenario():
        key = gpux.Key.generate()
        async with await gpux.Client.connect(f"{dead},{url}", key, role="renter") as renter:
            assert renter.account is not None
        with pytest.raises(OSError):
            await gpux.Client.connect(f"{dead}, {dead}", key)

    run(scenario())


def test_an_order_that_fills_brings_its_trade_and_lease_on_the_private_feed(exchange):
    url, operator = exchange

    async def scenario():
        supplier, host = await supplier_with_gpus(url)
        ask = gpux.OrderTicket.limit(H100_SPOT, "sell", gpux.dollars("2"), 1, supply={"host": host, "gpu_mask": 1})
        await supplier.place(ask)
        renter = await funded_renter(url, operator)
        async with await gpux.Client.connect(url) as anonymous:
            stats = await anonymous.supplier_stats(supplier.account)
            assert stats.window_days == 30 and stats.record.score_bps is None, "public, and unrated before any lease closed"
            assert [h.host for h in stats.hosts] == [host]
            offers = await anonymous.book_offers(H100_SPOT)
            assert [(o.price_minor_per_gpu_hour, o.supplier, o.host, o.supplier_score_bps) for o in offers] == [
                (2_000_000, supplier.account, host, None)
            ], offers
            # The same ask found by a search across every book.
            found = await anonymous.search(min_gpu_memory_gb=80, contracts=["spot"], sort="price_per_gb")
            assert [(f.symbol, f.price_minor_per_gpu_hour, f.supplier, f.gpu_memory_mib) for f in found] == [
                ("H100-SXM-80G/SPOT", 2_000_000, supplier.account, 81_559)
            ], found
            assert found[0].price_minor_per_gb_hour == 2_000_000 * 1_000_000_000 // (81_559 * 1_048_576)
            assert await anonymous.search(min_gpu_memory_gb=86) == []
            with pytest.raises(gpux.GpuxError) as unknown:
                await anonymous.supplier_stats(renter.account)
            assert unknown.value.code == "unknown_supplier"
        ack = await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("2.5"), 1, duration={"hours": 2}))
        assert isinstance(ack, gpux.Ack) and ack.order is not None
        kinds = set()
        while not {"trade", "lease_created"} <= kinds:
            kinds.add((await renter.next_event()).kind)
        leases = await renter.leases()
        assert len(leases) == 1 and leases[0].price_minor_per_gpu_hour == 2_000_000 and leases[0].active
        assert (await renter.balance()).held_minor == 4_000_000, "two hours at the trade price in escrow"
        # The rest of the lease could go on the resale book (docs/market-rules.md "Lease resale").
        offer = await renter.offer_lease(leases[0].lease, gpux.dollars("3"))
        assert offer.order is not None
        with pytest.raises(gpux.GpuxError) as twice:
            await renter.offer_lease(leases[0].lease, gpux.dollars("3"))
        assert twice.value.code == "lease_already_offered"
        await renter.cancel(offer.order)
        # The renter signs what it saw of the lease (docs/market-rules.md "Disputes").
        lease = leases[0]
        end = min(renter.exchange_now_ms(), lease.start_ms + 60_000)
        end = max(end, lease.start_ms + 1)
        await asyncio.sleep(max(0, end - renter.exchange_now_ms()) / 1000)
        ack = await renter.liveness(lease.lease, lease.start_ms, end, True)
        assert isinstance(ack, gpux.Ack)
        with pytest.raises(gpux.GpuxError) as overlapping:
            await renter.liveness(lease.lease, lease.start_ms, end, False)
        assert overlapping.value.code == "liveness_invalid", "each observation starts after the previous one"
        with pytest.raises(gpux.GpuxError) as theirs:
            await supplier.liveness(lease.lease, end, end + 1, False)
        assert theirs.value.code == "unknown_lease", "only the renter observes its lease"
        async with await gpux.Client.connect(url) as anonymous:
            record = await anonymous.renter_stats(renter.account)
            assert record == gpux.answers.RenterRecord(observations=1, unreachable_ms=0, disputes=0, disputed_gpu_ms=0)
        await renter.close()
        await supplier.close()

    run(scenario())


def test_stop_budget_and_all_or_none_orders_work_from_python(exchange):
    url, operator = exchange

    async def scenario():
        supplier, host = await supplier_with_gpus(url)
        renter = await funded_renter(url, operator)
        # An all-or-none bid for 2 waits whole while one GPU is offered.
        await supplier.place(gpux.OrderTicket.limit(H100_SPOT, "sell", gpux.dollars("2"), 1, supply={"host": host, "gpu_mask": 1}))
        gang = await renter.place(gpux.OrderTicket.all_or_none_bid(H100_SPOT, gpux.dollars("2.5"), 2))
        assert gang.order is not None
        # A buy stop at 2.00 arms; a budget bid that buys the offered GPU prints 2.00 and triggers it.
        stop = await renter.place(gpux.OrderTicket.stop_limit(H100_SPOT, "buy", gpux.dollars("2"), gpux.dollars("2.2"), 1))
        with pytest.raises(gpux.GpuxError) as small:
            await renter.place(gpux.OrderTicket.with_budget(H100_SPOT, gpux.dollars("2"), gpux.dollars("1"), 3))
        assert small.value.code == "budget_too_small"
        await renter.place(gpux.OrderTicket.with_budget(H100_SPOT, gpux.dollars("2"), gpux.dollars("3"), 3, time_in_force="ioc"))
        seen = {}
        while "stop_triggered" not in seen:
            event = await renter.next_event()
            seen[event.kind] = event
        assert seen["stop_armed"].fields["order"] == stop.order
        assert seen["stop_triggered"].fields["last_trade_price_minor_per_gpu_hour"] == 2_000_000
        await renter.close()
        await supplier.close()

    run(scenario())


def test_gpus_leases_money_and_the_statement_from_python(exchange):
    url, operator = exchange

    async def scenario():
        supplier = await gpux.Client.connect(url, gpux.Key.generate(), role="supplier")
        spec = {"vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link", "mig_profile": None}
        await supplier.register_gpu("py-host", "GPU-py-0", spec)
        gpus = await supplier.my_gpus()
        assert [(g.uuid, g.online) for g in gpus] == [("GPU-py-0", True)]
        await supplier.set_gpu_online(gpus[0].gpu, False)
        assert not (await supplier.my_gpus())[0].online
        await supplier.set_gpu_online(gpus[0].gpu, True)
        await supplier.place(gpux.OrderTicket.limit(H100_SPOT, "sell", gpux.dollars("2"), 1, supply={"host": gpus[0].host, "gpu_mask": 1}))
        renter = await funded_renter(url, operator)
        await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("2"), 1))
        lease = (await renter.leases())[0].lease
        await renter.end_lease(lease)
        assert not (await renter.leases())[0].active
        stats = await renter.stats(H100_SPOT)
        assert stats.last == 2_000_000 and stats.trades == 1, stats
        await renter.withdraw(gpux.dollars("1"))
        lines = await renter.statement()
        assert any(l.to == "external" and l.amount_minor == 1_000_000 for l in lines), lines
        await renter.set_spend_limits(max_held_minor=gpux.dollars("1"))
        with pytest.raises(gpux.GpuxError) as capped:
            await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("1.5"), 1))
        assert capped.value.code == "spend_limit"
        assert (await renter.spend()).limits.max_held_minor == gpux.dollars("1")
        await renter.set_spend_limits()
        assert await renter.spend() is None
        newest = await renter.recent_statement()
        assert newest.lines[0] == lines[-1], "newest first: the withdrawal"
        assert [l.transfer for l in newest.lines] == [l.transfer for l in reversed(lines)][: len(newest.lines)]
        with pytest.raises(gpux.GpuxError) as nothing_earned:
            await supplier.payout(gpux.dollars("1"))
        assert nothing_earned.value.code == "insufficient_funds"
        await renter.close()
        await supplier.close()

    run(scenario())


def test_a_regional_bid_buys_only_in_its_region_and_amounts_follow_the_listings_currency(exchange):
    url, operator = exchange

    async def scenario():
        async with await gpux.Client.connect(url) as anonymous:
            listing = await anonymous.listing()
            currency = await anonymous.currency()
            assert abs(await anonymous.ping() - time.time() * 1000) < 60_000, "the exchange's clock"
        assert "cn-east" in listing.regions and currency == gpux.Currency("USD", 6)
        assert currency.format(2_500_000) == "$2.50" and currency.to_minor("2.5") == 2_500_000
        cny = gpux.Currency("CNY", 2)
        assert (cny.format(150_505), cny.to_minor("1505.05")) == ("1505.05 CNY", 150_505)
        with pytest.raises(ValueError):
            cny.to_minor("0.001")

        supplier = await gpux.Client.connect(url, gpux.Key.generate(), role="supplier")
        spec = {"vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link", "mig_profile": None}
        await supplier.register_gpu("py-virginia", "GPU-py-va", spec, region="us-east")
        await supplier.register_gpu("py-shanghai", "GPU-py-sh", spec, region="cn-east", zone="sh-2")
        with pytest.raises(gpux.GpuxError) as moved:
            await supplier.register_gpu("py-shanghai", "GPU-py-sh-2", spec, region="us-west")
        assert moved.value.code == "region_mismatch"
        gpus = await supplier.my_gpus()
        assert [(g.region, g.zone) for g in gpus] == [("us-east", ""), ("cn-east", "sh-2")]
        for gpu, price in zip(gpus, ("1.5", "2.5")):
            supply = {"host": gpu.host, "gpu_mask": 1 << gpu.index_on_host}
            await supplier.place(gpux.OrderTicket.limit(H100_SPOT, "sell", currency.to_minor(price), 1, supply=supply))
        renter = await funded_renter(url, operator)
        await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", currency.to_minor("3"), 1, regions=["cn-east"]))
        lease = (await renter.leases())[0]
        assert lease.price_minor_per_gpu_hour == 2_500_000, "the cn-east GPU, passing the cheaper us-east one by"
        assert lease.gpus == [gpus[1].gpu]
        assert await renter.lease_telemetry(lease.lease) == [], "no usage report yet"
        other = await funded_renter(url, operator)
        with pytest.raises(gpux.GpuxError) as foreign:
            await other.lease_telemetry(lease.lease)
        assert foreign.value.code == "unknown_lease", "only the lease's renter and supplier see it"
        await other.close()
        with pytest.raises(gpux.GpuxError) as unknown:
            await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", currency.to_minor("3"), 1, regions=["atlantis"]))
        assert unknown.value.code == "unknown_region"
        await renter.close()
        await supplier.close()

    run(scenario())


def test_a_cluster_bid_fills_hosts_of_one_fabric_only_and_a_wrong_shape_is_refused(exchange):
    url, operator = exchange

    async def scenario():
        supplier = await gpux.Client.connect(url, gpux.Key.generate(), role="supplier")
        spec = {"vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link", "mig_profile": None}
        for index, fabric in enumerate(["py-ib", "py-ib", None]):
            claim = {"group": fabric, "gbps": 400, "address": f"10.9.0.{index}", "port_base": 29500} if fabric else None
            await supplier.register_gpu(f"py-node-{index}", f"GPU-py-node-{index}", spec, region="us-east", zone="z9", fabric=claim)
        with pytest.raises(gpux.GpuxError) as rewired:
            claim = {"group": "py-ib2", "gbps": 400, "address": "10.9.0.0", "port_base": 29500}
            await supplier.register_gpu("py-node-0", "GPU-py-node-0b", spec, region="us-east", zone="z9", fabric=claim)
        assert rewired.value.code == "fabric_mismatch"
        gpus = await supplier.my_gpus()
        assert [g.fabric and (g.fabric.name, g.fabric.hosts) for g in gpus] == [("py-ib", 2), ("py-ib", 2), None]
        # The host without a fabric asks least; the cluster passes it over.
        for gpu, price in zip(gpus, (2_000_000, 2_100_000, 1_000_000)):
            supply = {"host": gpu.host, "gpu_mask": 1 << gpu.index_on_host}
            await supplier.place(gpux.OrderTicket.limit(H100_SPOT, "sell", price, 1, supply=supply))
        renter = await funded_renter(url, operator)
        with pytest.raises(gpux.GpuxError) as shape:
            await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", 3_000_000, 3, nodes=2))
        assert shape.value.code == "cluster_invalid", "3 GPUs on 2 nodes"
        await renter.place(gpux.OrderTicket.cluster_bid(H100_SPOT, 3_000_000, nodes=2, gpus_per_node=1, min_fabric_gbps=400))
        leases = await renter.leases()
        assert sorted(lease.gpus[0] for lease in leases) == [gpus[0].gpu, gpus[1].gpu]
        assert sorted(lease.price_minor_per_gpu_hour for lease in leases) == [2_000_000, 2_100_000]
        await renter.close()
        await supplier.close()

    run(scenario())


def test_an_aggregator_keeps_customers_apart_in_sub_accounts_with_scoped_keys(exchange):
    url, operator = exchange

    async def scenario():
        parent = await funded_renter(url, operator, "500")
        customers = []
        for amount in ("100", "50"):
            sub = await parent.open_sub_account()
            await parent.move_funds(sub, gpux.dollars(amount))
            key = gpux.Key.generate()
            added = await parent.add_key(key.public_hex(), ["read", "trade"], account=sub, label=f"customer {sub}")
            assert added.account == sub
            customers.append((sub, await gpux.Client.connect(url, key)))
        (a, alice), (b, bob) = customers
        assert (alice.account, bob.account) == (a, b), "each key logs in to its sub-account"
        await parent.set_sub_account_limits(a, max_open_orders=1)
        ack = await alice.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("2"), 1))
        with pytest.raises(gpux.GpuxError) as limited:
            await alice.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("2"), 1))
        assert limited.value.code == "sub_account_limit"
        assert await bob.open_orders() == [], "Bob sees nothing of Alice's"
        with pytest.raises(gpux.GpuxError) as theirs:
            await bob.cancel(ack.order)
        assert theirs.value.code == "not_your_order"
        with pytest.raises(gpux.GpuxError) as scoped:
            await bob.withdraw(1)
        assert scoped.value.code == "scope_denied"
        subs = {s.account: s for s in await parent.sub_accounts()}
        assert subs[a].balances.held_minor == 2_000_000 and subs[a].open_orders == 1
        assert subs[a].limits == gpux.answers.SubAccountLimits(max_open_orders=1, max_order_minor=None, max_held_minor=None)
        assert subs[b].balances.available_minor == 50_000_000
        keys = await parent.keys(account=b)
        assert [k.scopes for k in keys] == [["read", "trade"]] and not keys[0].owner
        pending = asyncio.create_task(bob.balance())
        await parent.revoke_key(keys[0].public_key)
        with pytest.raises(gpux.GpuxError) as revoked:
            # The session is closed at once: what was in flight, and anything
            # sent after, fails with the close reason.
            await pending  # answered before the revocation, or failed by it
            await bob.balance()
        assert revoked.value.code == "key_revoked"
        with pytest.raises(gpux.GpuxError) as after:
            await bob.balance()
        assert after.value.code == "key_revoked"
        await parent.move_funds(b, gpux.dollars("50"), to_sub_account=False)
        assert (await parent.balance()).available_minor == gpux.dollars("500") - gpux.dollars("100")
        await alice.close()
        await parent.close()

    run(scenario())


def test_last_months_invoice_verifies_with_the_exchange_key_and_a_changed_one_does_not():
    operator, key = gpux.Key.generate(), gpux.Key.generate()
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        with exchange_on(data, operator, port) as url:

            async def this_month():
                renter = await gpux.Client.connect(url, key, role="renter")
                async with await gpux.Client.connect(url, operator, role="operator") as op:
                    await op.deposit(renter.account, gpux.dollars("100"))
                await renter.withdraw(gpux.dollars("10"))
                now = renter.exchange_now_ms()
                with pytest.raises(gpux.GpuxError) as open_month:
                    await renter.invoice(time.strftime("%Y-%m", time.gmtime(now / 1000)))
                assert open_month.value.code == "period_invalid"
                await renter.close()
                return renter.account, now

            account, now = run(this_month())
        month = time.strftime("%Y-%m", time.gmtime(now / 1000))
        year, mon = map(int, month.split("-"))
        next_month = f"{year + (mon == 12)}-{1 if mon == 12 else mon + 1:02d}-01"
        month_end = calendar.timegm(time.strptime(next_month, "%Y-%m-%d")) * 1000
        offset = month_end + 3_600_000 - int(time.time() * 1000)
        with exchange_on(data, operator, port, ["--clock-offset-ms", str(offset), "--invoice-issuer", "Example GPU Exchange Ltd"]) as url:

            async def next_one():
                async with await gpux.Client.connect(url, key) as renter:
                    got = await renter.invoice(month)
                    invoice = got.invoice
                    assert invoice.number == f"GPUX-{account}-{month.replace('-', '')}"
                    assert invoice.issuer == "Example GPU Exchange Ltd"
                    assert invoice.totals.deposits_minor == gpux.dollars("100")
                    assert invoice.totals.withdrawals_minor == gpux.dollars("10")
                    assert invoice.totals.amount_due_minor == 0 and invoice.lines == []
                    assert gpux.verify_invoice(invoice, got.signature, got.exchange_key), "Python rebuilds the signed bytes"
                    wire = invoice.to_wire()
                    changed = dict(wire, totals=dict(wire["totals"], withdrawals_minor=1))
                    assert not gpux.verify_invoice(changed, got.signature, got.exchange_key)

            run(next_one())


def test_a_client_with_reconnect_logs_in_again_and_resyncs_its_book_after_the_exchange_restarts():
    operator, key = gpux.Key.generate(), gpux.Key.generate()
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        first = exchange_on(data, operator, port)
        url = first.__enter__()

        async def scenario():
            nonlocal first
            client = await gpux.Client.connect(url, key, role="renter", reconnect=True)
            async with await gpux.Client.connect(url, operator, role="operator") as op:
                await op.deposit(client.account, gpux.dollars("100"))
            book = await client.book(H100_SPOT)
            await book.wait_synced()
            await client.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("1.5"), 2))
            await book.wait_for(lambda b: b.best_bid() == gpux.dollars("1.5"))
            account = client.account
            first.__exit__(None, None, None)
            with pytest.raises(gpux.GpuxError):
                await client.balance()
            assert not book.synced or client.closed is not None
            first = exchange_on(data, operator, port)
            first.__enter__()
            await client.wait_connected(timeout=30)
            assert client.reconnects == 1 and client.account == account, "the same account, logged in again"
            assert (await client.balance()).held_minor == gpux.dollars("3"), "the bid's hold survived the restart"
            await book.wait_for(lambda b: b.best_bid() == gpux.dollars("1.5"), timeout=15)
            assert book.synced, "the book resynced from a fresh snapshot"
            await client.close()

        try:
            run(scenario())
        finally:
            first.__exit__(None, None, None)


def test_the_package_carries_its_type_information():
    assert (Path(gpux.__file__).parent / "py.typed").exists(), "PEP 561 marker"


def test_a_book_follows_orders_live_and_resyncs_after_a_sequence_gap(exchange):
    url, operator = exchange

    async def scenario():
        renter = await funded_renter(url, operator)
        watcher = await gpux.Client.connect(url)
        book = await watcher.book(H100_SPOT)
        await book.wait_synced()
        await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("1.9"), 2))
        await book.wait_for(lambda b: b.bids.get(1_900_000) == 2)

        # A lost update: the next one does not follow; the book refuses it.
        assert not book.apply(gpux.BookUpdate(H100_SPOT, book.seq + 5, "buy", 1_800_000, 7))
        assert not book.synced
        await watcher.resync(book)
        await book.wait_synced()
        assert book.bids == {1_900_000: 2} and book.resyncs == 1, "a fresh snapshot, without the phantom level"
        await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("1.8"), 1))
        await book.wait_for(lambda b: b.bids.get(1_800_000) == 1)
        await renter.close()
        await watcher.close()

    run(scenario())


def test_the_example_bot_quotes_both_sides(exchange):
    url, operator = exchange
    import market_maker

    async def scenario():
        key = gpux.Key.generate()
        aggregator = await gpux.Client.connect(url, key, role="aggregator")
        spec = {"vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link", "mig_profile": None}
        await aggregator.request("register_gpu", host="bot-host", gpu_uuid="GPU-bot-0", spec=spec)
        host = (await aggregator.request("my_gpus")).gpus[0].host
        async with await gpux.Client.connect(url, operator, role="operator") as op:
            await op.deposit(aggregator.account, gpux.dollars("100"))
        await aggregator.close()
        await market_maker.run(url, key, "H100-SXM-80G/SPOT", 1, 200, rounds=1, host=host, keep=True)
        async with await gpux.Client.connect(url, key) as client:
            sides = sorted(order.side for order in await client.open_orders())
            assert sides == ["buy", "sell"], sides
            book = await client.book(H100_SPOT)
            await book.wait_synced()
            assert book.best_bid() < book.best_ask(), "two-sided and not crossed"

    run(scenario())


def test_a_renter_follows_delivery_to_running_with_secrets_only_the_host_can_open(exchange):
    """The Python client as renter and, speaking the documented protocol, as
    the host: the host publishes a signed X25519 key, the renter seals its
    secrets to it, the host opens them and reports statuses that reach the
    renter's feed and its `lease_delivery` query."""
    url, operator = exchange
    from nacl.public import PrivateKey

    from gpux import delivery

    async def workload_for(supplier, lease):
        while True:
            message = await asyncio.wait_for(supplier.events.get(), 10)
            if isinstance(message, gpux.messages.Unknown) and message.type == "workload" and message.fields["lease"] == lease:
                return message.fields["workload"]

    async def scenario():
        identity = gpux.Key.generate()
        supplier, host = await supplier_with_gpus(url, key=identity)
        host_secret = PrivateKey.generate()
        await supplier.request("set_encryption_key", **delivery.certify(host_secret, identity.sign))
        await supplier.place(gpux.OrderTicket.limit(H100_SPOT, "sell", gpux.dollars("2"), 1, supply={"host": host, "gpu_mask": 1}))

        renter = await funded_renter(url, operator)
        bid = gpux.Workload("localhost/gpux-test:busybox", ports=[8888], secrets_follow=True)
        await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("2.5"), 1), workload=bid)
        event = await renter.next_event()
        while event.kind != "lease_created":
            event = await renter.next_event()
        lease = event.fields["lease"]
        first = await workload_for(supplier, lease)
        assert first["secrets_follow"] and first["sealed"] is None, "the bid's workload reaches the host without secrets"

        secrets = gpux.Secrets(
            env={"HF_TOKEN": "hf_python_secret"},
            ssh_keys=["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPython renter@laptop"],
            readiness={"port": 8888, "http_path": "/health"},
        )
        await renter.set_workload(lease, gpux.Workload("localhost/gpux-test:busybox", ports=[8888]), secrets)
        sealed = (await workload_for(supplier, lease))["sealed"]
        assert "hf_python_secret" not in str(sealed)
        opened = gpux.Secrets.unseal(sealed, host_secret)
        assert opened.env == {"HF_TOKEN": "hf_python_secret"}, "only the host's key opens them"
        assert opened.readiness == {"port": 8888, "http_path": "/health"}
        with pytest.raises(Exception):
            gpux.Secrets.unseal(sealed, PrivateKey.generate())

        await supplier.request("delivery_status", lease=lease, state={"pulling": {"bytes_done": 1 << 20, "bytes_total": 4 << 20}})
        running = {"running": {"endpoints": [{"container_port": 8888, "host": "127.0.0.1", "port": 40123}], "ssh": None, "restarts": 0}}
        await supplier.request("delivery_status", lease=lease, state=running)
        update = await renter.wait_delivery(lease, timeout=10)
        assert gpux.describe(update.state) == "running 127.0.0.1:40123->8888"
        known = await renter.lease_delivery(lease)
        assert known.state == running and known.workload["ports"] == [8888] and "hf_python_secret" not in str(known.workload)

        # A command in the workload (issue 64), answered by the host as
        # docs/protocol.md "Exec" says; an empty one is refused with its code.
        async def answer_exec():
            while True:
                pushed = await supplier.events.get()
                if getattr(pushed, "type", None) == "exec_wanted":
                    wanted = pushed.fields
                    assert wanted["command"] == ["nvidia-smi", "-L"] and wanted["lease"] == lease, wanted
                    outcome = {"exit_code": 0, "output": "GPU 0: H100\n", "truncated": False, "timed_out": False, "refused": None}
                    await supplier.request("exec_done", request=wanted["request"], outcome=outcome)
                    return
        answering = asyncio.create_task(answer_exec())
        outcome = await renter.lease_exec(lease, ["nvidia-smi", "-L"], timeout_ms=5000)
        await asyncio.wait_for(answering, 10)
        assert (outcome.exit_code, outcome.output, outcome.refused) == (0, "GPU 0: H100\n", None), outcome
        with pytest.raises(gpux.GpuxError) as invalid:
            await renter.lease_exec(lease, [], timeout_ms=5000)
        assert invalid.value.code == "exec_invalid"

        # A workload that exits is never waited on as if it might run.
        await supplier.request("delivery_status", lease=lease, state={"exited": {"code": 3}})
        with pytest.raises(gpux.GpuxError) as exited:
            await renter.wait_delivery(lease, timeout=10)
        assert exited.value.code == "exited" and "code 3" in str(exited.value)

        # A host-side failure ends the lease (nothing charged; the escrow goes
        # back at billing close, docs/market-rules.md "Delivery"); the
        # renter's wait says why.
        failed = {"failed": {"code": "host_error", "fault": "host", "reason": "the GPU fell off the bus"}}
        await supplier.request("delivery_status", lease=lease, state=failed)
        with pytest.raises(gpux.GpuxError) as failure:
            await renter.wait_delivery(lease, timeout=10)
        assert failure.value.code == "host_error"
        event = await renter.next_event()
        while event.kind != "lease_ended":
            event = await renter.next_event()
        assert event.fields == {"lease": lease, "reason": "delivery_failed"}
        ended = (await renter.leases())[0]
        assert not ended.active and ended.usage_charged_minor == 0
        await renter.close()
        await supplier.close()

    run(scenario())


def test_liveness_is_signed_as_the_protocol_document_says():
    from gpux.client import liveness_signed_bytes

    signed = liveness_signed_bytes(17, 1796223720000, 1796223780000, False)
    assert signed.hex() == "677075782d6c6976656e6573732d76313a11fd40da4637a2010000fda0c44737a201000000"
    key = gpux.Key.from_hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    assert key.sign(signed).hex() == (
        "55c028c8cfc21147374bd4e4b1bde385ae2b50a5de1c70c8eb7f56004661da3b"
        "37e9711d364846ded4f0b3bf9ba151527eba18deb972e0e496031f16411ef103"
    )


def test_a_book_ignores_updates_older_than_its_snapshot_and_reports_a_gap():
    from gpux import messages as m
    from gpux.client import Book

    book = Book(0)
    book.apply(m.BookSnapshot(instrument=0, seq=10, bids=[[100, 2]], asks=[]))
    assert book.apply(m.BookUpdate(instrument=0, seq=10, side="buy", price_minor_per_gpu_hour=100, quantity=7))
    assert book.bids == {100: 2}, "an update the snapshot already holds changes nothing"
    assert book.apply(m.BookUpdate(instrument=0, seq=11, side="buy", price_minor_per_gpu_hour=100, quantity=0))
    assert book.bids == {}
    assert not book.apply(m.BookUpdate(instrument=0, seq=13, side="buy", price_minor_per_gpu_hour=90, quantity=1))
    assert not book.synced


def test_a_market_data_batch_parses_in_order_and_a_conflated_book_applies_only_where_it_continues():
    from gpux import messages as m
    from gpux.client import Book

    batch = m.parse(
        {
            "market_data": {
                "messages": [
                    {"book_update": {"instrument": 0, "seq": 11, "side": "buy", "price_minor_per_gpu_hour": 100, "quantity": 3}},
                    {"book_conflated": {"instrument": 0, "from_seq": 12, "seq": 40, "bids": [[100, 0], [90, 4]], "asks": [[120, 1]]}},
                ]
            }
        }
    )
    assert isinstance(batch, m.MarketData)
    assert [type(each) for each in batch.messages] == [m.BookUpdate, m.BookConflated]
    book = Book(0)
    book.apply(m.BookSnapshot(instrument=0, seq=10, bids=[[100, 2]], asks=[]))
    assert all(book.apply(each) for each in batch.messages)
    assert (book.seq, book.bids, book.asks) == (40, {90: 4}, {120: 1})
    # Already applied: nothing changes.
    assert book.apply(m.BookConflated(instrument=0, from_seq=30, seq=40, bids=[[90, 9]], asks=[]))
    assert book.bids == {90: 4}
    # Not where the book is: a gap.
    assert not book.apply(m.BookConflated(instrument=0, from_seq=42, seq=50, bids=[], asks=[]))
    assert not book.synced


def test_history_over_the_websocket_and_the_rest_api_agree():
    """Trades, candles, fills and the book after one trade, from the
    WebSocket and from the REST API (signed for the account's paths)."""
    operator = gpux.Key.generate()
    port, http = free_port(), free_port()
    with tempfile.TemporaryDirectory() as data:
        process = subprocess.Popen(
            [str(EXCHANGE), "--data-dir", data, "--listen", f"127.0.0.1:{port}", "--metrics-listen", "off",
             "--console-listen", f"127.0.0.1:{http}", "--operator-key", operator.public_hex()],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            for line in process.stdout:
                if "listening on" in line:
                    break
            url, base = f"ws://127.0.0.1:{port}", f"http://127.0.0.1:{http}"

            async def scenario():
                supplier, host = await supplier_with_gpus(url)
                await supplier.place(gpux.OrderTicket.limit(H100_SPOT, "sell", gpux.dollars("2"), 1, supply={"host": host, "gpu_mask": 1}))
                key = gpux.Key.generate()
                renter = await gpux.Client.connect(url, key, role="renter")
                async with await gpux.Client.connect(url, operator, role="operator") as op:
                    await op.deposit(renter.account, gpux.dollars("100"))
                await renter.place(gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("2.5"), 1))
                trades = await renter.trades(H100_SPOT)
                assert [(t.price_minor_per_gpu_hour, t.quantity, t.aggressor) for t in trades.trades] == [(2_000_000, 1, "buy")]
                assert trades.next_before_seq is None
                candles = await renter.candles(H100_SPOT, "1m")
                assert [(c.open, c.close, c.volume, c.trades) for c in candles.candles] == [(2_000_000, 2_000_000, 1, 1)]
                bought = (await renter.fills()).fills
                sold = (await supplier.fills()).fills
                assert [(f.side, f.liquidity) for f in bought] == [("buy", "taker")]
                assert [(f.side, f.liquidity) for f in sold] == [("sell", "maker")]
                book = await renter.book_once(H100_SPOT)
                assert book.asks == [] and book.bids == [], "the ask was taken whole"

                public, signed = gpux.Rest(base), gpux.Rest(base, key)
                # REST answers the same objects, without the request id.
                assert public.get(f"/api/v1/instruments/{H100_SPOT}/trades") == without_id(trades)
                assert public.get(f"/api/v1/instruments/{H100_SPOT}/candles?interval=1m") == without_id(candles)
                assert signed.get("/api/v1/account/fills") == {"fills": [f.to_wire() for f in bought], "next_before": None}
                assert signed.get("/api/v1/account/balance")["held_minor"] == (await renter.balance()).held_minor
                with pytest.raises(gpux.GpuxError) as unsigned:
                    public.get("/api/v1/account/fills")
                assert (unsigned.value.code, unsigned.value.status) == ("not_authenticated", 401)
                with pytest.raises(gpux.GpuxError) as interval:
                    public.get(f"/api/v1/instruments/{H100_SPOT}/candles?interval=5m")
                assert (interval.value.code, interval.value.status) == ("wrong_type", 400)
                with pytest.raises(gpux.GpuxError) as unknown:
                    public.get("/api/v1/instruments/999/trades")
                assert (unknown.value.code, unknown.value.status) == ("unknown_instrument", 404)

                # Writes: a bid placed by symbol, sent again under its key
                # (answered again, applied once), cancelled, refused.
                bid = {"order": {"client_order_id": 901, "instrument": "H100-SXM-80G/SPOT", "side": "buy",
                                 "price_minor_per_gpu_hour": 1_000_000, "quantity": 1}}
                placed = signed.write("POST", "/api/v1/orders", bid, idempotency_key="py-bid-1")
                assert signed.write("POST", "/api/v1/orders", bid, idempotency_key="py-bid-1") == placed
                assert next(iter(placed["events"][0]["kind"])) == "order_accepted"
                assert [o["order"] for o in signed.get("/api/v1/account/orders")["orders"]] == [placed["order"]]
                cancelled = signed.write("DELETE", f"/api/v1/orders/{placed['order']}")
                assert "order_closed" in [next(iter(e["kind"])) for e in cancelled["events"]]
                with pytest.raises(gpux.GpuxError) as reused:
                    signed.write("POST", "/api/v1/orders", {"order": {**bid["order"], "quantity": 2}}, idempotency_key="py-bid-1")
                assert (reused.value.code, reused.value.status) == ("idempotency_key_reused", 422)
                with pytest.raises(gpux.GpuxError) as rejected:
                    signed.write("DELETE", f"/api/v1/orders/{placed['order']}")
                assert rejected.value.status == 422 and rejected.value.journal_seq > placed["journal_seq"]
                assert signed.get("/api/v1/account/orders")["orders"] == []
                await renter.close()
                await supplier.close()

            run(scenario())
        finally:
            process.terminate()
            process.wait(timeout=10)


def test_a_job_is_submitted_followed_cancelled_and_billed_from_python(exchange, tmp_path):
    url, operator = exchange

    async def scenario():
        from nacl.public import PrivateKey

        from gpux import delivery

        identity = gpux.Key.generate()
        supplier = await gpux.Client.connect(url, identity, role="supplier")
        # A job's bid trades only with suppliers whose hosts take workloads.
        await supplier.request("set_encryption_key", **delivery.certify(PrivateKey.generate(), identity.sign))
        spec = {"vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link", "mig_profile": None}
        await supplier.register_gpu("py-job-host", "GPU-py-job-0", spec)
        gpus = await supplier.my_gpus()
        await supplier.place(gpux.OrderTicket.limit(H100_SPOT, "sell", gpux.dollars("2"), 1, supply={"host": gpus[0].host, "gpu_mask": 1}))
        renter = await funded_renter(url, operator)
        code = tmp_path / "code"
        code.mkdir()
        (code / "train.py").write_text("print('step')\n")
        bundle = await renter.put_bundle(gpux.pack_bundle(code))
        job = {
            "name": "py-job", "instrument": H100_SPOT, "gpus": 1, "one_host": True,
            "limit_minor_per_gpu_hour": gpux.dollars("2"), "hours": 1, "budget_minor": gpux.dollars("10"), "retries": 1,
            "run": {"image": "localhost/gpux-py:1", "command": ["python3", "train.py"], "bundle": bundle,
                    "checkpoint_dir": "/checkpoints", "outputs_dir": "/outputs", "checkpoint_interval_s": 60},
        }
        with pytest.raises(gpux.GpuxError) as refused:
            await renter.submit_job(dict(job, gpus=0))
        assert refused.value.code == "job_invalid" and "gpus" in str(refused.value), refused.value
        submitted = await renter.submit_job(job)
        # Its bid filled: `starting` until its host reports the workload running.
        starting = await renter.wait_job(submitted.job, until=("starting",))
        lease = starting.state_fields["leases"][0]
        running_state = {"running": {"endpoints": [], "ssh": None, "restarts": 0}}
        await supplier.request("delivery_status", lease=lease, state=running_state)
        running = await renter.wait_job(submitted.job, until=("running",))
        assert running.state_fields["leases"] == [lease]
        assert [j.job for j in await renter.jobs()] == [submitted.job]
        with pytest.raises(gpux.GpuxError) as same:
            await renter.resize_job(submitted.job, 1)
        assert same.value.code == "job_not_running"
        growing = await renter.resize_job(submitted.job, 2)
        assert growing.state_name == "running" and growing.attempts == 2, "it runs on while the bigger bid rests"
        await renter.cancel_job(submitted.job)
        cancelled = await renter.wait_job(submitted.job, until=("cancelled",))
        assert cancelled.leases == [lease]
        assert await renter.job_results(submitted.job, tmp_path / "results") == [], "nothing ran: no outputs"
        assert await renter.job_logs(submitted.job) == {}, "no host ran it: no output kept"
        bill = await renter.job_bill(submitted.job)
        assert bill.invoice.number == f"GPUX-{renter.account}-job{submitted.job}"
        assert all(line.lease == lease for line in bill.invoice.lines), bill
        with pytest.raises(gpux.GpuxError) as unknown:
            await renter.job(999_999)
        assert unknown.value.code == "unknown_job"
        await renter.close()
        await supplier.close()

    run(scenario())


def test_a_service_keeps_its_replica_scales_updates_and_is_deleted_from_python(exchange):
    url, operator = exchange

    async def scenario():
        from nacl.public import PrivateKey

        from gpux import delivery

        # A supplier whose host takes workloads (replicas trade only with such) offers one GPU.
        identity = gpux.Key.generate()
        supplier = await gpux.Client.connect(url, identity, role="supplier")
        await supplier.request("set_encryption_key", **delivery.certify(PrivateKey.generate(), identity.sign))
        spec = {"vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link", "mig_profile": None}
        await supplier.register_gpu("py-service-host", "GPU-py-service-0", spec)
        gpus = await supplier.my_gpus()
        await supplier.place(gpux.OrderTicket.limit(H100_SPOT, "sell", gpux.dollars("2"), 1, supply={"host": gpus[0].host, "gpu_mask": 1}))
        renter = await funded_renter(url, operator)
        service = {
            "name": "py-echo", "instrument": H100_SPOT, "gpus": 1, "limit_minor_per_gpu_hour": gpux.dollars("2.5"),
            "budget_minor_per_hour": gpux.dollars("5"), "replicas": 1, "min_replicas": 0, "max_replicas": 2,
            "image": "localhost/gpux-py:1", "command": ["python3", "-m", "http.server", "8000"], "port": 8000,
            "readiness_path": "/", "key_hashes": [gpux.service_key_hash("py-service-key")],
        }
        with pytest.raises(gpux.GpuxError) as refused:
            await renter.create_service(dict(service, port=0))
        assert refused.value.code == "service_invalid" and "port" in str(refused.value), refused.value
        # A floor must be a spot book beside a service on a preemptible one.
        floor = {"instrument": H100_SPOT, "replicas": 1, "limit_minor_per_gpu_hour": gpux.dollars("2.5")}
        with pytest.raises(gpux.GpuxError) as no_floor:
            await renter.create_service(dict(service, min_replicas=1), floor=floor)
        assert no_floor.value.code == "service_invalid" and "floor" in str(no_floor.value), no_floor.value
        created = await renter.create_service(service)
        # Its bid filled on the offered GPU: the replica starts, then is ready at its endpoint.
        starting = await renter.wait_service(created.service, lambda s: s.replicas and s.replicas[0]["state"] == "starting")
        lease = starting.replicas[0]["lease"]
        running = {"running": {"endpoints": [{"container_port": 8000, "host": "198.51.100.4", "port": 32001}], "ssh": None, "restarts": 0}}
        await supplier.request("delivery_status", lease=lease, state=running)
        ready = await renter.wait_service(created.service, lambda s: len(s.ready()) == 1)
        assert ready.ready()[0]["endpoint"] == "198.51.100.4:32001"
        assert [s.service for s in await renter.services()] == [created.service]
        with pytest.raises(gpux.GpuxError) as over:
            await renter.scale_service(created.service, 3)
        assert over.value.code == "service_scale_invalid"
        with pytest.raises(gpux.GpuxError) as not_scaling:
            await renter.service_load(created.service, 1, 5_000, 1, 0)
        assert not_scaling.value.code == "service_not_scaling"
        # An update rolls: a second replica of the new run bids beside the first.
        rolling = await renter.update_service(created.service, {"image": "localhost/gpux-py:2", "command": [], "port": 8000, "readiness_path": "/"})
        assert rolling.rollout == "rolling" and rolling.generation == 1 and len(rolling.replicas) == 2, rolling
        deleted = await renter.delete_service(created.service)
        assert deleted.state == "deleted" and deleted.replicas == []
        # The bill of a deleted service, signed (no host reported usage: the
        # podman tests check its lines).
        bill = await renter.service_bill(created.service)
        assert bill.invoice.number == f"GPUX-{renter.account}-service{created.service}"
        assert all(line.lease == lease for line in bill.invoice.lines), bill
        with pytest.raises(gpux.GpuxError) as unknown_bill:
            await renter.service_bill(999_999)
        assert unknown_bill.value.code == "unknown_service"
        with pytest.raises(gpux.GpuxError) as unknown:
            await renter.service(999_999)
        assert unknown.value.code == "unknown_service"
        await renter.close()
        await supplier.close()

    run(scenario())


def test_a_volume_is_created_filled_mounted_by_a_bid_and_deleted_from_python(exchange):
    url, operator = exchange

    async def scenario():
        renter = await funded_renter(url, operator)
        data = await renter.create_volume("py-data", 2)
        assert (data.name, data.size_gib, data.state, data.writer) == ("py-data", 2, "ready", None)
        with pytest.raises(gpux.GpuxError) as taken:
            await renter.create_volume("py-data", 1)
        assert taken.value.code == "volume_exists"
        with pytest.raises(gpux.GpuxError) as bad:
            await renter.create_volume("../etc", 1)
        assert bad.value.code == "volume_invalid"
        await renter.put_volume_file("py-data", "notes/readme.txt", b"kept across leases")
        assert await renter.volume_files("py-data") == {"notes/readme.txt": b"kept across leases"}
        # A resting bid (no ask that low) with a workload claims the volume
        # read-write: another writer is refused, a reader is not.
        workload = {"image": "localhost/gpux-test:latest", "secrets_follow": True}
        writer = gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("1"), 1, volumes=[{"volume": "py-data", "mount": "/data"}])
        await renter.request("new_order", order=writer.to_wire(), workload=workload)
        claimed = next(v for v in await renter.volumes() if v.name == "py-data")
        assert claimed.writer_bid is not None and claimed.writer is None
        second = gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("1"), 1, volumes=[{"volume": "py-data", "mount": "/d"}])
        with pytest.raises(gpux.GpuxError) as in_use:
            await renter.request("new_order", order=second.to_wire(), workload=workload)
        assert in_use.value.code == "volume_in_use"
        reader = gpux.OrderTicket.limit(H100_SPOT, "buy", gpux.dollars("1"), 1, volumes=[{"volume": "py-data", "mount": "/d", "read_only": True}])
        await renter.request("new_order", order=reader.to_wire(), workload=workload)
        with pytest.raises(gpux.GpuxError) as held:
            await renter.delete_volume("py-data")
        assert held.value.code == "volume_in_use"
        await renter.request("mass_cancel", instrument=None)
        deleted = await renter.delete_volume("py-data")
        assert deleted.state == "deleted"
        assert await renter.volumes() == []
        with pytest.raises(gpux.GpuxError) as gone:
            await renter.volume_token("py-data")
        assert gone.value.code == "unknown_volume"
        await renter.close()

    run(scenario())
