"""What the try tokens cost (``gwtf/node/runtime/dataplane/try_token.py``), against one hop
receipt's signature and recovery (what every receipted hop already pays at each end).

Per try of a microbatch: the origin signs one token; each receiver of one of its forwards
recovers it once, then finds it in its table for the try's other forwards (re-sends,
repairs). Per forward on the wire: 67 bytes of header. Microseconds of one core per try; each
round times the baseline and the three parts one after the other over ``--tries`` tries (a
fresh iteration each round, so the first checks find nothing in the table), and the figures
are the medians over ``--repeats`` rounds of the times and of the ratios.

Usage: python bench/try_token.py [--tries 2000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from eth_utils.crypto import keccak

from gwtf.contracts.encoding import recover_digest_signer, sign_digest
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.runtime.dataplane.hop import FORWARD, HopHeader, encode_hop
from gwtf.node.runtime.dataplane.try_token import TryTokens, sign_try, try_token_domain

KEY = keccak(text="bench try token")
ORIGIN = str(peer_id_of(identity_from_key(KEY)))
DOMAIN = try_token_domain(31337, "0x" + "ef" * 20)  # a run's chain and WorkLedger
PARTS = (
    "origin: the token signed",
    "receiver: its first forward of the try (recovery)",
    "receiver: the try's later forwards (from the table)",
)


def first_hops(n: int, iteration: int) -> list[HopHeader]:
    """``n`` tries' first forwards of ``iteration``, unsigned."""
    return [HopHeader(1, iteration, m, 0, FORWARD, 1, 0, 0, ORIGIN, (ORIGIN,)) for m in range(n)]


def per_try_us(run: Callable[[], object], n: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / n * 1e6


def one_round(n: int, iteration: int) -> list[float]:
    """The baseline's and each part's µs per try, in one round."""
    digests = [keccak(m.to_bytes(8, "big") + iteration.to_bytes(8, "big")) for m in range(n)]
    signatures: list[bytes] = []
    baseline = per_try_us(lambda: signatures.extend(sign_digest(d, KEY) for d in digests), n)
    baseline += per_try_us(
        lambda: [recover_digest_signer(d, s) for d, s in zip(digests, signatures, strict=True)], n
    )
    unsigned, signed = first_hops(n, iteration), []
    sign = per_try_us(lambda: signed.extend(sign_try(h, KEY, DOMAIN) for h in unsigned), n)
    table = TryTokens(DOMAIN, max_checked=2 * n)
    first = per_try_us(lambda: [table.check(h) for h in signed], n)
    kept = per_try_us(lambda: [table.check(h) for h in signed], n)
    return [baseline, sign, first, kept]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rounds = [one_round(args.tries, r) for r in range(args.repeats)]
    baseline = statistics.median(r[0] for r in rounds)
    unsigned = first_hops(1, 0)[0]
    signed = sign_try(unsigned, KEY, DOMAIN)
    extra_bytes = len(encode_hop(signed, b"")) - len(encode_hop(unsigned, b""))

    print(f"one receipt signed and recovered (the baseline): {baseline:.0f} µs")
    print("| per try | µs | / a receipt's signature + recovery |")
    print("|---|---|---|")
    for i, what in enumerate(PARTS, start=1):
        us = statistics.median(r[i] for r in rounds)
        ratio = statistics.median(r[i] / r[0] for r in rounds)
        print(f"| {what} | {us:.1f} | {ratio:.3f} |")
    print(f"header bytes a forward carries for it: {extra_bytes}")


if __name__ == "__main__":
    main()
