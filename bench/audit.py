"""What an audit costs: checking an epoch's receipts on one core, and fetching them from a node.

1. Checks (``gwtf.node.audit.checks``) of one data node's certificate of ``--receipts`` hops (real
   secp256k1 signatures, two stages, two workers), decoded from its pages as an auditor
   receives them: the tree rebuilt from its leaves against the root (served whole, in order),
   the totals and sequence, each hop by the disputes contract's validity rule (both signatures
   recovered; membership asked once per node), then equivocations across all of them (both
   signatures, recovered once: the auditor caches each signer). Receipts per second of CPU
   time (one thread; run it under ``taskset -c 0`` for one core; goal >= 5,000), against the
   bare cost of recovering two signatures per receipt in the same run.
2. Fetching that certificate's leaves with their proofs over ``/gwtf/receipts/3.0.0`` from a real
   libp2p host on loopback: as a peer of the run (no rate limit) and as an outsider (the shared
   public rate, 10 pages a second with a burst of 20), against decoding the same pages in
   process.

Re-executing sampled hops has its own benchmark, ``bench/reexecution.py``.

Usage: python bench/audit.py [--receipts 100000] [--fetch 100000] [--public 20000] [--repeats 3]
       [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import time
from collections import defaultdict

import trio
from eth_utils.crypto import keccak
from libp2p.peer.id import ID

from gwtf.contracts.certificate_tree import (
    CertificateTree,
    LeafProof,
    SignedReceipt,
    build_certificate_tree,
)
from gwtf.contracts.encoding import (
    BACKWARD,
    FORWARD,
    HopReceipt,
    ledger_domain,
    node_address_of,
    node_public_key,
    recover_digest_signer,
    sign_receipt,
)
from gwtf.node.audit.checks import RunRules, _signer, audit_certificate, equivocations
from gwtf.node.p2p.host import peer_info, running_host
from gwtf.node.p2p.identity import identity_from_key
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.serving import CERTIFIED, ReceiptServer, certified_page, fetch_receipts
from gwtf.node.receipts.wire import MAX_PAGE, decode_page, encode_page
from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore

DOMAIN = ledger_domain(31337, "0x" + "ab" * 20)
UNITS = 10
KEYS = {name: keccak(text=f"bench audit {name}") for name in ("data", "a", "b", "auditor")}
ADDRESSES = {name: node_address_of(node_public_key(key)) for name, key in KEYS.items()}


def epoch_of(count: int) -> list[SignedReceipt]:
    """``count`` receipts of microbatches through a (stage 1) and b (stage 2), each signed by
    its worker and countersigned by its receiver."""
    a, b, data = ADDRESSES["a"], ADDRESSES["b"], ADDRESSES["data"]
    links = (
        (1, FORWARD, "a", b), (2, FORWARD, "b", data), (2, BACKWARD, "b", a),
        (1, BACKWARD, "a", data),
    )  # fmt: skip
    receivers = {b: "b", data: "data", a: "a"}
    entries = []
    for m in range(count // 4 + 1):
        for stage, direction, worker, to in links:
            if len(entries) == count:
                return entries
            digests = keccak(f"{m} {stage} {direction}".encode())
            units = UNITS if direction == FORWARD else 2 * UNITS
            r = HopReceipt(
                1, 0, data, 0, m, stage, direction, 0, ADDRESSES[worker], to, digests,
                keccak(digests), units,
            )  # fmt: skip
            entries.append(
                SignedReceipt(
                    r,
                    sign_receipt(r, DOMAIN, KEYS[worker]),
                    sign_receipt(r, DOMAIN, KEYS[receivers[to]]),
                )
            )
    return entries


def as_fetched(tree: CertificateTree) -> list[tuple[SignedReceipt, LeafProof]]:
    """The certificate's receipts with their leaves as an auditor holds them: decoded from its
    pages, new objects whose hashes are not computed yet."""
    return [
        (entry, leaf)
        for offset in range(0, tree.count, MAX_PAGE)
        for page in [decode_page(encode_page(certified_page(tree, offset, MAX_PAGE)))]
        for entry, leaf in zip(page.entries, page.leaves, strict=True)
    ]


def check_rates(tree: CertificateTree, repeats: int) -> tuple[float, float, float]:
    """Receipts per second of CPU time, the fastest of ``repeats`` alternating rounds (other
    work on a shared core only slows a round down): bare signature recovery, the certificate's
    checks, equivocations (across the receipts just checked, as an audit does)."""
    cert = tree.cert_ref(1, 0, ADDRESSES["data"])
    rules = RunRules(2, UNITS, DOMAIN)
    best = [0.0, 0.0, 0.0]
    for _ in range(repeats):
        _signer.cache_clear()  # each round recovers every signature afresh, as one audit does
        entries = [e for e, _ in as_fetched(tree)]
        started = time.process_time()
        for e in entries:
            digest = e.signing_digest(DOMAIN)
            recover_digest_signer(digest, e.worker_signature)
            recover_digest_signer(digest, e.counterparty_signature)
        bare = len(entries) / (time.process_time() - started)
        served = as_fetched(tree)
        started = time.process_time()
        findings = audit_certificate(cert, served, rules, lambda node, or_data_node: True)
        checked = len(served) / (time.process_time() - started)
        assert findings == [], findings[:3]
        started = time.process_time()
        assert equivocations([e for e, _ in served], DOMAIN) == []
        unique = len(served) / (time.process_time() - started)
        best = [max(b, rate) for b, rate in zip(best, (bare, checked, unique), strict=True)]
    return best[0], best[1], best[2]


#: (part, pattern of a profiled function ``file:name``), in order: a function is the first
#: part's whose pattern it matches; keccak256 is counted in its callers' parts.
PROFILE_PARTS: list[tuple[str, str]] = [
    ("recovery: secp256k1_ecdsa_recover (two)", r"secp256k1_ecdsa_recover"),
    (
        "recovery: coincurve's wrapper, OpenZeppelin's checks, key -> address",
        r"/coincurve/|_libsecp256k1|_cffi|recover_digest_signer|node_address_of|_address_of_key"
        r"|_checksummed|_canonical_address|checks\.py:_signer$",
    ),
    (
        "EIP-712: receipt digest, hop key, signatures hash",
        r"struct_hash|hop_key|receipt_digest|typed_data_digest|signatures_hash|separator"
        r"|_word$|_address_bytes|_is_the_leafs|'pack'|functools\.py:__get__|RLock",
    ),
    ("Merkle: leaf hashes, tree rebuilt, proofs", r":leaf$|merkle\.py|_whole_tree|with_proof"),
    (
        "validation: schedule, totals, sequence, membership",
        r"invalid_because|_contradicts_totals|_sequence_findings|_breaks|scheduled_units"
        r"|checks\.py:cached$|'lower'|<lambda>",
    ),
    ("equivocation grouping", r"equivocation"),
]


def profile_parts(tree: CertificateTree) -> None:
    """Where the checks' and equivocations' time goes, by part (cProfile: it inflates every
    Python call, so the parts other than recovery weigh more here than they do unprofiled)."""
    _signer.cache_clear()
    served = as_fetched(tree)
    cert = tree.cert_ref(1, 0, ADDRESSES["data"])
    profile = cProfile.Profile()
    profile.enable()
    audit_certificate(cert, served, RunRules(2, UNITS, DOMAIN), lambda node, or_data: True)
    equivocations([e for e, _ in served], DOMAIN)
    profile.disable()
    rest = "object building, loops, the rest"
    patterns = [(part, re.compile(pattern)) for part, pattern in PROFILE_PARTS]

    def part_of(function: tuple[str, int, str]) -> str:
        name = f"{function[0]}:{function[2]}"
        return next((part for part, pattern in patterns if pattern.search(name)), rest)

    spent: dict[str, float] = defaultdict(float)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for function, (_, _, own, _, callers) in stats.items():
        if function[2] == "keccak256":  # its time, with the C digest under it, to its callers
            for caller, (_, _, _, from_caller) in callers.items():
                spent[part_of(caller)] += from_caller
        elif "_pysha3" not in function[2]:
            spent[part_of(function)] += own
    print(f"\n{'where the time goes (cProfile), us per receipt':<72}{'us':>8}{'share':>8}")
    total_s = sum(spent.values())
    for part in [p for p, _ in PROFILE_PARTS] + [rest]:
        print(f"{part:<72}{spent[part] / len(served) * 1e6:>8.1f}{spent[part] / total_s:>8.1%}")
    print(f"{'all':<72}{total_s / len(served) * 1e6:>8.1f}")


def decode_rate(tree: CertificateTree) -> float:
    """Receipts per second of paging the certificate in process (encode and decode)."""
    started = time.perf_counter()
    for offset in range(0, tree.count, MAX_PAGE):
        decode_page(encode_page(certified_page(tree, offset, MAX_PAGE)))
    return tree.count / (time.perf_counter() - started)


async def fetch_rate(tree: CertificateTree, count: int, admitted: bool) -> float:
    """Receipts per second fetching ``count`` leaves of ``tree`` from a data node's host."""
    auditor = identity_from_key(KEYS["auditor"])
    auditor_id = str(ID.from_pubkey(auditor.public_key))
    store = HopStore(open_database("sqlite://"))
    terms = ReceiptTerms(1, DOMAIN, 2, UNITS)

    async def admit(peer: str) -> bool:
        return admitted and peer == auditor_id

    async with (
        running_host(identity_from_key(KEYS["data"])) as host,
        running_host(auditor) as client,
    ):
        ReceiptServer(store, terms, {0: tree}.get).serve(RequestResponse(host, admit=admit), 30.0)
        await client.connect(peer_info(f"{host.get_addrs()[0]}/p2p/{host.get_id()}"))
        rpc = RequestResponse(client)
        started = time.perf_counter()
        fetched = await fetch_receipts(rpc, str(host.get_id()), 1, 0, CERTIFIED, 30.0, count)
        elapsed = time.perf_counter() - started
    assert len(fetched.entries) == count, fetched.stopped  # (stopped: at ``count``, as asked)
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=100_000)
    parser.add_argument("--fetch", type=int, default=100_000, help="leaves fetched as a peer")
    parser.add_argument("--public", type=int, default=20_000, help="leaves fetched in public")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the checks, fastest kept")
    parser.add_argument("--profile", action="store_true", help="only where the checks' time goes")
    args = parser.parse_args()
    started = time.perf_counter()
    tree = build_certificate_tree(epoch_of(args.receipts), DOMAIN)
    made_s = time.perf_counter() - started
    print(f"{args.receipts:,} signed receipts and their tree in {made_s:.0f} s")
    if args.profile:
        profile_parts(tree)
        return
    bare, checked, unique = check_rates(tree, args.repeats)
    both = 1 / (1 / checked + 1 / unique)
    in_process = decode_rate(tree)
    as_peer = trio.run(fetch_rate, tree, min(args.fetch, tree.count), True)
    in_public = trio.run(fetch_rate, tree, min(args.public, tree.count), False)
    n = f"{args.receipts:,}"
    rows = [
        (f"two signatures recovered per receipt, {n} (receipts/s)", f"{bare:,.0f}", "baseline"),
        (f"certificate checks of {n} leaves (receipts/s)", f"{checked:,.0f}",
         f"{checked / bare:.2f} of baseline"),
        (f"equivocations across {n} receipts, signers known (receipts/s)", f"{unique:,.0f}",
         f"{unique / bare:.2f} of baseline"),
        ("the whole audit of an epoch, one core (receipts/s)", f"{both:,.0f}", ">= 5000"),
        ("certificate pages encoded + decoded in process (receipts/s)", f"{in_process:,.0f}",
         "baseline"),
        (f"fetched over p2p as a peer of the run, {min(args.fetch, tree.count):,} (receipts/s)",
         f"{as_peer:,.0f}", f"{as_peer / in_process:.2f} of in process"),
        (f"fetched in public (10 pages/s), {min(args.public, tree.count):,} (receipts/s)",
         f"{in_public:,.0f}", f"{in_public / in_process:.3f} of in process"),
        (f"an epoch of {n} receipts fetched as a peer / in public (s)",
         f"{args.receipts / as_peer:.1f} / {args.receipts / in_public:.1f}", ""),
    ]  # fmt: skip
    print(f"{'measure':<66}{'value':>14}  vs")
    for label, value, goal in rows:
        print(f"{label:<66}{value:>14}  {goal}")


if __name__ == "__main__":
    main()
