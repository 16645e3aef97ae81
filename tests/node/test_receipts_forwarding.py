"""An auditor reads the receipts of a node it cannot dial through a node connected to it
(``/gwtf/receipts-via/3.0.0``), as the audit does for a relay at home: the forwarder passes
only over connections it has, the next forwarder is tried when one declines (and read too
after one that passes on none, for a juror), and an
equivocation in the unreached node's own receipts is found (real hosts on loopback, a real
SQLite store; the NAT case is tests/internet/test_swarm_chain_bed.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gwtf.node.audit.checks import equivocations
from gwtf.node.audit.replays import EvidenceSource
from gwtf.node.audit.runner import read_receipts
from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import identity_from_key, new_identity
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.receipts.cheats import EQUIVOCATE, Cheat
from gwtf.node.receipts.serving import (
    RECEIPTS_VIA_PROTOCOL,
    RECEIVED,
    ReceiptServer,
    serve_receipts_forwarding,
)
from gwtf.node.receipts.wire import ReceiptPage, encode_page
from gwtf.node.store.batches import RECEIVER, WORKER, BatchStore
from gwtf.node.store.database import open_database
from tests.node.sealed_receipts import keep_sealed
from tests.node.test_receipt_serving import (
    ADDRESS,
    DOMAIN,
    KEYS,
    TERMS,
    signed,
)
from tests.p2p.test_host_stop import run_bounded


def test_a_node_nobody_dials_is_read_through_a_forwarder_and_its_equivocation_found(
    tmp_path: Path,
) -> None:
    store = BatchStore(open_database(f"sqlite:///{tmp_path / 'a.sqlite'}"), DOMAIN)
    mine = [signed(m) for m in range(3)]
    keep_sealed(store, mine, WORKER)
    received = [signed(100 + m, worker="b", receiver="a") for m in range(2)]
    keep_sealed(store, received, RECEIVER)
    # "a" countersigns a second version of the first hop it received and serves it.
    cheat = Cheat(EQUIVOCATE, KEYS["a"], DOMAIN, TERMS.units_per_hop)
    cheat.received(received[0])

    async def main() -> None:
        async with (
            running_host(identity_from_key(KEYS["a"])) as home,
            running_host(identity_from_key(KEYS["data"])) as data_node,
            running_host(new_identity()) as stranger,
            running_host(new_identity()) as blinder,
            running_host(new_identity()) as auditor,
        ):
            ReceiptServer(store, TERMS, cheat=cheat).serve(RequestResponse(home), 5.0)
            forwarding = RequestResponse(data_node)
            serve_receipts_forwarding(forwarding, 5.0)
            serve_receipts_forwarding(RequestResponse(stranger), 5.0)
            blinding = RequestResponse(blinder)

            async def blind(_peer: str, _request: bytes) -> bytes:
                return encode_page(ReceiptPage(0, 0, ()))  # "it serves none"

            blinding.serve(RECEIPTS_VIA_PROTOCOL, blind, RpcLimits(256, 1 << 20, 5.0))
            rpc = RequestResponse(auditor)
            for node in (data_node, stranger, blinder):
                await rpc.dialer.connect(node.get_id(), node.get_addrs())
            home_id = str(home.get_id())
            routes: list[str | None] = [str(stranger.get_id()), str(data_node.get_id())]
            with trio.fail_after(30):
                nothing, via, why = await read_receipts(rpc, home_id, routes, 1, 0, 5.0)
                assert (nothing, via) == ([], None)
                assert why is not None and "not connected" in why, why
                # The home node keeps its data node connected, as keepalive does.
                await forwarding.dialer.connect(home.get_id(), home.get_addrs())
                read, via, why = await read_receipts(rpc, home_id, routes, 1, 0, 5.0)
                assert (via, why) == (str(data_node.get_id()), None)
                assert set(read) == {*mine, *received, *cheat.extras[(0, 1)]}
                (found,) = equivocations(read, DOMAIN)
                assert found.accused.lower() == ADDRESS["a"].lower() and found.proof is not None
                # A juror's evidence source reads it the same way (a backward's forward receipts),
                # a forwarder passing on none first not hiding what the next passes on.
                a = ADDRESS["a"].lower()
                forwarders = [
                    str(blinder.get_id()),
                    str(stranger.get_id()),
                    str(data_node.get_id()),
                ]
                source = EvidenceSource(rpc, {}, 1, 5.0, {a: home_id}, forwarders)
                countersigned = await source.receipts(a, 0, RECEIVED)
                assert set(countersigned) == {*received, *cheat.extras[(0, 1)]}
                limits = RpcLimits(256, 64, 5.0)
                for bad in (b"", b"\x05abc", bytes([len(home_id)]) + home_id.encode() + b"x"):
                    with pytest.raises(PeerUnavailable, match="forwarded receipts request"):
                        await rpc.request(data_node.get_id(), RECEIPTS_VIA_PROTOCOL, bad, limits)

    run_bounded(main)
