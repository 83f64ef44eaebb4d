"""A two-sided quoting bot: keeps a bid and an ask around the book's mid.

It needs an aggregator account (it may both buy and sell): its asks are
backed by GPUs it registered (`--host` and `--gpus`), or, in a reserved
window, by contracts it holds (leave `--host` out). Each round it reads the
live book, cancels its quotes and posts new ones (post-only) around the mid.

    python examples/market_maker.py --url ws://127.0.0.1:7300 --key ~/.gpux/key --instrument H100-SXM-80G/SPOT --host 0 --quantity 1
"""

import argparse
import asyncio

import gpux


def quotes(book: gpux.Book, spread_bps: int, tick: int, empty_mid: int) -> tuple[int, int]:
    """Bid and ask prices on the tick around the mid (or the one side
    there is; `empty_mid` on an empty book)."""
    bid, ask = book.best_bid(), book.best_ask()
    if bid and ask:
        mid = (bid + ask) // 2
    else:
        mid = bid or ask or empty_mid
    half = max(tick, mid * spread_bps // 20_000)
    return (mid - half) // tick * tick, (mid + half + tick - 1) // tick * tick


async def run(
    url: str, key: gpux.Key, symbol: str, quantity: int, spread_bps: int, rounds: int, host=None, keep=False, empty_mid="2.00"
) -> None:
    supply = None if host is None else {"host": host, "gpu_mask": (1 << quantity) - 1}
    async with await gpux.Client.connect(url, key) as client:
        listed = await client.instrument(symbol)
        instrument, tick = listed.instrument, listed.tick_minor
        currency = await client.currency()
        empty_mid_minor = currency.to_minor(empty_mid)
        book = await client.book(instrument)
        await book.wait_synced()
        resting: dict[str, int] = {}
        for _ in range(rounds):
            bid, ask = quotes(book, spread_bps, tick, empty_mid_minor)
            for side, price in (("buy", bid), ("sell", ask)):
                if side in resting:
                    try:
                        await client.cancel(resting.pop(side))
                    except gpux.GpuxError:
                        pass  # it traded meanwhile
                try:
                    order = gpux.OrderTicket.limit(instrument, side, price, quantity, post_only=True)
                    if side == "sell":
                        order.supply = supply
                    ack = await client.place(order)
                    resting[side] = ack.order
                except gpux.GpuxError as refused:
                    print(f"{side} at {currency.format(price)} refused: {refused.code}")
            print(f"quoting {currency.format(bid)} / {currency.format(ask)} per GPU-hour")
            if rounds > 1:
                await asyncio.sleep(2)
        if not keep:
            await client.cancel_all(instrument)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="ws://127.0.0.1:7300")
    parser.add_argument("--key", default="~/.gpux/key")
    parser.add_argument("--instrument", default="H100-SXM-80G/SPOT", help="the book's symbol, CLASS/CONTRACT")
    parser.add_argument("--quantity", type=int, default=1, help="GPUs per quote (the first N GPUs of --host)")
    parser.add_argument("--host", type=int, default=None, help="host id of the aggregator's GPUs backing its asks")
    parser.add_argument("--spread-bps", type=int, default=200)
    parser.add_argument("--empty-mid", default="2.00", help="the mid to quote around while the book is empty, per GPU-hour in the exchange's currency")
    parser.add_argument("--rounds", type=int, default=1_000_000)
    args = parser.parse_args()
    key = gpux.Key.load(args.key)
    asyncio.run(run(args.url, key, args.instrument, args.quantity, args.spread_bps, args.rounds, args.host, empty_mid=args.empty_mid))
