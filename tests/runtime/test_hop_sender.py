"""An acknowledged hop tells the flow core its receiver is alive
(``gwtf/node/runtime/dataplane/sender.py``), so keep-alives need not ping a peer that data flows
to."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import base58
import pytest
import trio
import trio.testing
from eth_utils.crypto import keccak
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.pb import crypto_pb2
from libp2p.peer.id import ID

from gwtf.contracts.encoding import ledger_domain
from gwtf.coordinator_free.protocol import FlowConfig, FlowNode, NodeSpec
from gwtf.coordinator_free.wire import CostAdvert, Hello, HopAck, encode
from gwtf.errors import ProtocolError
from gwtf.node.p2p.discovery_records import PeerCard, card_key, open_card, sign_card
from gwtf.node.p2p.host import build_host
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.p2p.rpc import (
    Decline,
    PeerTimeout,
    PeerUnavailable,
    RequestDeclined,
    RequestResponse,
)
from gwtf.node.receipts.book import HopFacts, ReceiptTerms, address_of_peer
from gwtf.node.receipts.recording import ReceiptBook
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import DataPlane, HopRejected
from gwtf.node.runtime.dataplane.hop import (
    BACKWARD,
    FLAG_REPAIR,
    FORWARD,
    HopHeader,
    ReceiptInput,
    decode_hop_request,
    frame_digest,
)
from gwtf.node.runtime.dataplane.sender import HopSender, HopStats, PassedBack, resend_refusal
from gwtf.node.runtime.dataplane.try_token import TryTokenError, origin_address
from gwtf.node.runtime.discovery.address_book import AddressBook, PeerRecord, parse_record
from gwtf.node.runtime.flow.routing import SwarmWiring
from gwtf.node.runtime.flow.service import FlowService
from gwtf.node.store.batches import RECEIVER, WORKER, BatchStore
from gwtf.node.store.database import open_database

ACK_S = 0.25  # how long the receiver takes to acknowledge a hop


class AckingPlane(DataPlane):
    """A data plane whose every send is acknowledged after ``ACK_S``."""

    async def send(
        self, to: str, header: HopHeader, frame: bytes, input_digest: bytes | None = None
    ) -> bytes:
        await trio.sleep(ACK_S)
        return b""


def test_an_acknowledged_forward_or_backward_counts_as_hearing_from_its_receiver() -> None:
    config = FlowConfig(stages=2, activation_bytes=1e6)
    node = FlowNode(NodeSpec("a", "relay", 1, 2, 20.0), config, random.Random(0))
    for peer, role, stage in (("d", "data", 0), ("b", "relay", 2)):
        node.handle(peer, Hello(role, stage, 2, 2, 2, 0, 20.0, 0, True), 0.0)
    unused: Any = None  # the sends never reach the network, and nothing is declared dead
    plane = AckingPlane(unused, "a", 1, 2, 1.0, 1 << 20)
    sender = HopSender(plane, FlowService(unused, node, tick_s=1.0), HopStats(), None)
    forward = HopHeader(1, 0, 7, 0, FORWARD, 2, 0, 0, "d", ("d", "a"))
    backward = HopHeader(1, 0, 7, 0, BACKWARD, 0, 0, 0, "d", ("d", "a", "b", "d"))
    heard: dict[str, float] = {}

    async def main() -> None:
        await trio.sleep(10.0)
        assert await sender.send_forward(forward, b"out", "b", b"in") == "b"
        heard["b"] = node.peers["b"].last_heard_s
        await trio.sleep(10.0)
        await sender.send_backward(sender.pass_back(backward, b"grad", b"in"))
        heard["d"] = node.peers["d"].last_heard_s

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert heard == {"b": 10.0 + ACK_S, "d": 20.0 + 2 * ACK_S}


# ---- where a forward off any flow goes --------------------------------------------------------


class DeadPlane(DataPlane):
    """A data plane whose sends to the peers in ``dead`` miss their ack deadline; the others
    are acknowledged."""

    dead: frozenset[str] = frozenset()
    sent_to: list[tuple[str, int]]

    async def send(
        self, to: str, header: HopHeader, frame: bytes, input_digest: bytes | None = None
    ) -> bytes:
        self.sent_to.append((to, header.attempt))
        if to in self.dead:
            raise PeerTimeout(f"{to} is gone")
        return b""


def test_a_forward_off_any_flow_goes_to_the_peer_with_room_and_the_cheapest_way_on() -> None:
    """As in the simulator (``decisions.next_hop``), not to a random replica: a relay whose
    microbatch is on no carried flow sends it to the next-stage peer that knows a way to a sink
    and has room, cheapest first; a missed ack declares that one dead and the re-send goes to
    the next best."""
    config = FlowConfig(stages=2, activation_bytes=1e6)
    node = FlowNode(NodeSpec("a", "relay", 1, 2, 20.0), config, random.Random(0))
    adverts = {"b": (40.0, 2), "c": (10.0, 0), "e": (25.0, 1), "f": (math.inf, 2)}
    for peer, (cost, spare) in adverts.items():
        node.handle(peer, Hello("relay", 2, 2, 2, spare, 0, 20.0, 0, True), 0.0)
        node.handle(peer, CostAdvert(cost, spare), 0.0)
    unused: Any = None
    plane = DeadPlane(unused, "a", 1, 2, 1.0, 1 << 20)
    plane.dead, plane.sent_to = frozenset({"e"}), []
    sender = HopSender(plane, FlowService(unused, node, tick_s=1.0), HopStats(), None)
    assert sender.next_hop(2, None) == "e"  # c is full, f knows no way on, b costs more
    assert sender.next_hop(2, ("c", 5)) == "c"  # a carried flow is followed
    forward = HopHeader(1, 0, 7, 0, FORWARD, 2, 0, 0, "d", ("d", "a"))
    delivered = trio.run(sender.send_forward, forward, b"out", "e", b"in")
    assert delivered == "b" and plane.sent_to == [("e", 0), ("b", 1)]
    assert not node.peers["e"].alive


class DecliningPlane(DeadPlane):
    """``DeadPlane`` whose peers in ``declining`` are alive and decline every hop."""

    declining: frozenset[str] = frozenset()

    async def send(
        self, to: str, header: HopHeader, frame: bytes, input_digest: bytes | None = None
    ) -> bytes:
        if len(self.sent_to) > 8:
            raise AssertionError(f"sent over and over: {self.sent_to}")
        if to in self.declining:
            self.sent_to.append((to, header.attempt))
            raise RequestDeclined(f"{to} declines the hop")
        return await super().send(to, header, frame, input_digest)


def test_a_re_send_leaves_out_a_peer_that_declined_alive_though_it_stays_ranked_best() -> None:
    """A peer that declines a forward (``RequestDeclined``) stays alive in the flow core and
    stays the ranked best next hop; only the peers already tried keep the re-send off it, and
    once every peer is tried the send gives up instead of asking them again."""
    config = FlowConfig(stages=2, activation_bytes=1e6)
    node = FlowNode(NodeSpec("a", "relay", 1, 2, 20.0), config, random.Random(0))
    for peer, cost in (("b", 40.0), ("e", 25.0)):
        node.handle(peer, Hello("relay", 2, 2, 2, 2, 0, 20.0, 0, True), 0.0)
        node.handle(peer, CostAdvert(cost, 2), 0.0)
    unused: Any = None
    plane = DecliningPlane(unused, "a", 1, 2, 1.0, 1 << 20)
    plane.declining, plane.sent_to = frozenset({"e"}), []
    sender = HopSender(plane, FlowService(unused, node, tick_s=1.0), HopStats(), None)
    forward = HopHeader(1, 0, 7, 0, FORWARD, 2, 0, 0, "d", ("d", "a"))
    delivered = trio.run(sender.send_forward, forward, b"out", "e", b"in", lambda: ("e", 3))
    assert delivered == "b" and plane.sent_to == [("e", 0), ("b", 1)]
    assert node.peers["e"].alive and sender.next_hop(2, None) == "e"

    plane.dead, plane.sent_to = frozenset({"b"}), []
    try:
        trio.run(sender.send_forward, forward, b"out", "e", b"in", lambda: ("e", 3))
    except PeerUnavailable:
        pass
    else:
        raise AssertionError("delivered with every peer declining or dead")
    assert plane.sent_to == [("e", 0), ("b", 1)]


class RefusedStandIns(HopSender):
    """A hop sender whose asks for a re-send to a stand-in in ``refusing`` fail (that replica
    died unseen, or the node before the dead hop could not reach it)."""

    refusing: frozenset[str] = frozenset()
    asked: list[str]

    async def request_resend(self, header: HopHeader, replacement: str, attempt: int) -> None:
        self.asked.append(replacement)
        if len(self.asked) > 8:
            raise AssertionError(f"asked over and over: {self.asked}")
        if replacement in self.refusing:
            raise PeerUnavailable(f"{replacement} could not take the re-send")


def test_a_backward_around_a_dead_hop_asks_each_stand_in_once_until_one_takes_it() -> None:
    """``decisions.stand_in`` from the sender's view, the stand-ins that failed left out: the
    refusing replicas stay alive in the flow core, yet none is asked twice, and the gradient
    goes to the one that took the re-send."""
    config = FlowConfig(stages=2, activation_bytes=1e6)
    node = FlowNode(NodeSpec("d", "data", 0, 2, 20.0), config, random.Random(0))
    refusing = {f"x{i}" for i in range(5)}
    for peer in (*sorted(refusing), "z", "dead"):
        node.handle(peer, Hello("relay", 2, 2, 2, 2, 0, 20.0, 0, True), 0.0)
    unused: Any = None
    plane = DeadPlane(unused, "d", 1, 2, 1.0, 1 << 20)
    plane.dead, plane.sent_to = frozenset({"dead"}), []
    sender = RefusedStandIns(plane, FlowService(unused, node, tick_s=1.0), HopStats(), None)
    sender.refusing, sender.asked = frozenset(refusing), []
    backward = HopHeader(1, 0, 7, 0, BACKWARD, 2, 0, 0, "d", ("d", "a", "dead", "d"))
    record = PassedBack(backward, b"grad", b"in")
    trio.run(sender.send_backward, record)
    assert sender.asked[-1] == "z" and len(set(sender.asked)) == len(sender.asked)
    assert record.sent_to == "z" and record.header.path == ("d", "a", "z", "d")
    assert all(node.peers[peer].alive for peer in refusing)


# ---- hop keys a made-up repair could use up ----------------------------------------------------

DOMAIN = ledger_domain(31337, "0x" + "ef" * 20)
TERMS = ReceiptTerms(run_id=1, domain=DOMAIN, stages=2, units_per_hop=10)
KEYS = {name: keccak(text=f"hop sender test {name}") for name in ("data", "a", "s", "r")}
PEER = {name: str(peer_id_of(identity_from_key(key))) for name, key in KEYS.items()}


class EchoRpc:
    """Acknowledges every hop request with the digest of its frame, noting what it carried."""

    def __init__(self) -> None:
        self.sent: list[tuple[HopHeader, ReceiptInput | None]] = []

    def serve(self, *_: Any) -> None:
        pass  # no batch closes here

    async def open(self, peer: Any, protocol: str, timeout_s: float) -> None:
        pass  # connected: the hop goes at once

    async def request(self, peer: Any, protocol: str, payload: bytes, limits: Any) -> bytes:
        header, receipted, frame = decode_hop_request(payload)
        self.sent.append((header, receipted))
        ack = HopAck(
            str(header.microbatch_id), header.stage, header.direction, header.attempt,
            frame_digest(frame),
        )  # fmt: skip
        return encode(ack)


def book_of(tmp_path: Path, name: str) -> ReceiptBook:
    db = open_database(f"sqlite:///{tmp_path / name}.sqlite")
    return ReceiptBook(TERMS, KEYS[name], BatchStore(db, DOMAIN))


def test_a_made_up_repair_uses_up_at_most_one_hop_key_and_the_real_hop_takes_the_next(
    tmp_path: Path,
) -> None:
    """Another run member sends relay ``a`` made-up repairs of microbatch 7 under attempts
    0 and 1: ``a`` records a kept receipt for one of them only, and its real forward of
    microbatch 7 (attempt 0, whose hop key the made-up one took) goes out under attempt 1,
    receipted, instead of unreceipted."""
    book = book_of(tmp_path, "a")
    rpc = EchoRpc()
    plane = DataPlane(rpc, PEER["a"], 1, 2, 1.0, 1 << 20)  # type: ignore[arg-type]
    plane.use_receipts(book)
    made_up = HopHeader(1, 0, 7, 0, FORWARD, 1, 0, FLAG_REPAIR, PEER["data"], (PEER["data"],))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(book.run, rpc)
            first = await plane._record_kept(PEER["s"], made_up, keccak(b"in"), keccak(b"k0"))
            again = made_up.onward(attempt=1)
            second = await plane._record_kept(PEER["s"], again, keccak(b"in"), keccak(b"k1"))
            assert first and not second
            real = made_up.onward(stage=2, flags=0, path=(PEER["data"], PEER["a"]))
            await plane.send(PEER["s"], real, b"activation", keccak(b"real input"))
            nursery.cancel_scope.cancel()

    trio.run(main)
    [(header, receipted)] = rpc.sent
    assert header.attempt == 1 and receipted is not None


class KeepingRpc(EchoRpc):
    """Relay ``r`` keeping what it is sent: it records the kept output's receipt and names its
    digest in the ack."""

    def __init__(self, worker: DataPlane) -> None:
        super().__init__()
        self.worker = worker

    async def request(self, peer: Any, protocol: str, payload: bytes, limits: Any) -> bytes:
        header, _, frame = decode_hop_request(payload)
        kept = keccak(b"kept output")
        assert await self.worker._record_kept(PEER["s"], header, frame_digest(frame), kept)
        ack = HopAck(
            str(header.microbatch_id), header.stage, header.direction, header.attempt,
            frame_digest(frame), kept,
        )  # fmt: skip
        return encode(ack)


def test_a_repair_kept_by_its_receiver_is_recorded_alike_at_both_ends(tmp_path: Path) -> None:
    """``s`` re-sends a forward to ``r`` as a repair: ``r`` (its worker) records the kept
    output's receipt before its ack, ``s`` (its counterparty) records the same receipt from
    the ack, so ``r``'s batch of it is one ``s`` rebuilds and countersigns."""
    books = {name: book_of(tmp_path, name) for name in ("s", "r")}
    worker = DataPlane(None, PEER["r"], 1, 2, 5.0, 1 << 20)  # type: ignore[arg-type]
    worker.use_receipts(books["r"])
    rpc = KeepingRpc(worker)
    sender = DataPlane(rpc, PEER["s"], 1, 2, 5.0, 1 << 20)  # type: ignore[arg-type]
    sender.use_receipts(books["s"])
    path = (PEER["data"], PEER["s"])
    repair = HopHeader(1, 0, 7, 1, FORWARD, 2, 0, FLAG_REPAIR, PEER["data"], path)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for book in books.values():
                nursery.start_soon(book.run, rpc)
            await sender.send(PEER["r"], repair, b"activation")
            nursery.cancel_scope.cancel()

    trio.run(main)
    r, s = books["r"].address, books["s"].address
    at_worker = books["r"].store.open_hops(1, 0, r, s, WORKER, 10)
    at_sender = books["s"].store.open_hops(1, 0, r, s, RECEIVER, 10)
    assert len(at_worker) == 1 and at_worker == at_sender


# ---- who may ask for a re-send: stages two away are known by their signed cards ----------------


def test_a_node_two_stages_on_known_only_by_its_signed_card_may_ask_for_a_re_send() -> None:
    """Relay ``a`` of stage 1 (of 3) holds a forward; its flow neighbours are stages 0 and 2.
    The stage-3 node ``c`` after a dead stage-2 hop asks it for a re-send: ``a`` knows ``c``
    only through the signed card discovery verified, and serves it. A peer learned only by
    exchange (no card, so no stage) and one whose card names stage 2 are refused."""
    keys = {name: create_new_key_pair() for name in ("a", "d", "b", "c", "x", "s")}
    ids = {name: str(ID.from_pubkey(pair.public_key)) for name, pair in keys.items()}
    address = {name: f"/ip4/127.0.0.1/tcp/4001/p2p/{peer}" for name, peer in ids.items()}
    flow = FlowNode(
        NodeSpec(ids["a"], "relay", 1, 2, 20.0),
        FlowConfig(stages=3, activation_bytes=1e6),
        random.Random(0),
    )
    for name, role, stage in (("d", "data", 0), ("b", "relay", 2)):
        flow.handle(ids[name], Hello(role, stage, 3, 2, 2, 0, 20.0, 0, True), 0.0)
    rpc = RequestResponse(build_host(keys["a"]))
    book = AddressBook(rpc, PeerRecord(ids["a"], address["a"], "oregon"), lambda _record: None)
    for name, stage in (("c", 3), ("s", 2)):
        card = PeerCard(ids[name], 1, stage, "relay", "oregon", address[name], 1)
        opened = open_card(card_key(ids[name]), sign_card(card, keys[name].private_key))
        book.learn(PeerRecord(opened.peer_id, opened.address, opened.region, opened.stage))
    book.learn(parse_record(f"{address['x']} oregon"))  # hearsay of a peer exchange
    unused: Any = None
    plane = DataPlane(unused, ids["a"], 1, 3, 1.0, 1 << 20)
    sender = HopSender(plane, FlowService(unused, flow, tick_s=1.0), HopStats(), None)
    forward = HopHeader(1, 4, 7, 0, FORWARD, 1, 0, 0, ids["d"], (ids["d"],))

    def refusal(asker: str) -> str | None:
        request = control.Resend(4, 7, ids["b"], 1)
        return resend_refusal(ids[asker], request, forward, 1, 3, sender.stage_of)

    assert refusal("c")  # without the book, only flow neighbours have a stage
    sender.carded_stage = book.stage_of
    assert sender.stage_of(ids["b"]) == 2 and sender.stage_of(ids["c"]) == 3
    assert refusal("c") is None
    assert refusal("x") == f"{ids['x']} is neither the origin nor a node of stage 3"
    assert refusal("s")  # its card says stage 2: not the node after the dead hop
    assert refusal("d") is None  # the origin's own repair (it hands the attempt out)


def test_a_resend_is_given_the_time_its_one_send_may_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serving a ``Resend`` is one send: its stream opened (up to ``open_deadline_s``: a first
    hop to a home dials a circuit), then acknowledged. The asker waits for all of it, or a
    re-send that succeeds late is taken for failed and the forward sent to a second replica."""
    asked: list[float] = []

    async def ask(_rpc: Any, _to: str, _message: Any, timeout_s: float) -> bytes:
        asked.append(timeout_s)
        return control.encode_reply(True)

    monkeypatch.setattr(control, "ask", ask)
    config = FlowConfig(stages=2, activation_bytes=1e6)
    node = FlowNode(NodeSpec("a", "relay", 1, 2, 20.0), config, random.Random(0))
    unused: Any = None
    plane = AckingPlane(unused, "a", 1, 2, 5.0, 1 << 20)
    sender = HopSender(plane, FlowService(unused, node, tick_s=1.0), HopStats(), None)
    header = HopHeader(1, 0, 7, 2, FORWARD, 2, 0, 0, "d", ("d", "a", "b"))
    trio.run(sender.request_resend, header, "c", 3)
    assert plane.open_deadline_s == 12.0
    assert asked == [plane.open_deadline_s + 2 * plane.ack_deadline_s]


class RefusingTokenPlane(DataPlane):
    """A data plane whose every send fails with a protocol error of this node's own (not a
    peer's failure): a try token it cannot make."""

    async def send(
        self, to: str, header: HopHeader, frame: bytes, input_digest: bytes | None = None
    ) -> bytes:
        raise TryTokenError("a try token's run, iteration and microbatch are u64, its start u16")


def test_a_forward_that_fails_with_an_error_of_its_own_raises_it_as_it_came() -> None:
    """The probes of cut sends run in a nursery around the re-sends: an error that is no
    peer's failure must leave ``send_forward`` as itself, not wrapped in an exception group
    its callers would not catch."""
    config = FlowConfig(stages=2, activation_bytes=1e6)
    node = FlowNode(NodeSpec("a", "relay", 1, 2, 20.0), config, random.Random(0))
    node.handle("b", Hello("relay", 2, 2, 2, 2, 0, 20.0, 0, True), 0.0)
    unused: Any = None
    plane = RefusingTokenPlane(unused, "a", 1, 2, 1.0, 1 << 20)
    sender = HopSender(plane, FlowService(unused, node, tick_s=1.0), HopStats(), None)
    forward = HopHeader(1, 0, 7, 0, FORWARD, 2, 0, 0, "d", ("d", "a"))

    async def main() -> None:
        with pytest.raises(TryTokenError, match="try token"):
            await sender.send_forward(forward, b"out", "b", b"in")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_swarms_draws_and_stand_ins_skip_a_receiver_that_withheld_a_countersignature(
    tmp_path: Path,
) -> None:
    """SWARM's weighted draw and its re-sends leave out a peer that withheld a batch's
    countersignature this iteration, as the router does; only when it is the one left."""
    config = FlowConfig(stages=2, activation_bytes=1e6)
    node = FlowNode(NodeSpec("a", "relay", 1, 2, 20.0), config, random.Random(0))
    for peer in ("b", "c"):
        node.handle(peer, Hello("relay", 2, 2, 2, 2, 0, 20.0, 0, True), 0.0)
    unused: Any = None
    plane = DeadPlane(unused, "a", 1, 2, 1.0, 1 << 20)
    plane.receipts = book_of(tmp_path, "a")
    plane.receipts.withholders.withheld("b", "refused a batch")
    wiring = SwarmWiring(random.Random(1))
    sender = HopSender(plane, FlowService(unused, node, tick_s=1.0), HopStats(), wiring)
    assert {sender.next_hop(2, None) for _ in range(50)} == {"c"}
    assert {sender.stand_in(2, set()) for _ in range(50)} == {"c"}
    assert sender.stand_in(2, {"c"}) == "b"  # the only one left
    plane.receipts.withholders.new_iteration()
    assert {sender.next_hop(2, None) for _ in range(50)} == {"b", "c"}


class HandlingRpc:
    """``s``'s hop requests go straight to a receiver's ``_handle``; a decline comes back as
    the RPC layer gives it (uncharged)."""

    def __init__(self, receiver: DataPlane) -> None:
        self.receiver = receiver

    def serve(self, *_: Any) -> None:
        pass

    async def open(self, *_: Any) -> None:
        pass

    async def request(self, peer: Any, protocol: str, payload: bytes, limits: Any) -> bytes:
        try:
            return await self.receiver._handle(PEER["s"], payload)
        except Decline as exc:
            raise RequestDeclined(str(exc)) from exc


def test_a_hop_whose_receipt_the_receiver_failed_to_record_is_declined_not_acked(
    tmp_path: Path,
) -> None:
    """``r``'s database fails to record one of three hops: that hop is declined (nobody
    charged) instead of acknowledged, so ``s`` keeps its receipt held, out of the batch
    ``r`` countersigns; sent again, it is recorded and acked, and its batch closes too."""
    books = {name: book_of(tmp_path, name) for name in ("s", "r")}
    receiver = DataPlane(EchoRpc(), PEER["r"], 1, 2, 5.0, 1 << 20)  # type: ignore[arg-type]
    receiver.use_receipts(books["r"])
    receiver.try_tokens.check = lambda header: None  # type: ignore[method-assign]

    async def compute(header: HopHeader, frame: bytes) -> None:
        return None

    receiver.compute = compute  # type: ignore[method-assign]
    sender = DataPlane(HandlingRpc(receiver), PEER["s"], 1, 2, 5.0, 1 << 20)  # type: ignore[arg-type]
    sender.use_receipts(books["s"])
    real = books["r"]._recording.submit
    calls = [0]

    async def flaky(item: Any) -> bool:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("database is locked")
        return await real(item)

    books["r"]._recording.submit = flaky  # type: ignore[method-assign]
    path = (PEER["data"], PEER["s"])
    hops = [HopHeader(1, 0, mb, 0, FORWARD, 2, 0, 0, PEER["data"], path) for mb in range(3)]
    outcomes: list[str] = []
    refused: list[str] = []
    books["r"].penalise = books["s"].penalise = lambda peer, why: refused.append(why)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for book in books.values():
                nursery.start_soon(book.run, EchoRpc())
            receiver.serve(nursery)
            for header in [*hops, hops[1]]:
                try:
                    await sender.send(PEER["r"], header, b"act", keccak(b"in"))
                    outcomes.append("acked")
                except RequestDeclined:
                    outcomes.append("declined")
            await books["s"]._releasing.submit(b"")  # the acked ones released on disk
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert outcomes == ["acked", "declined", "acked", "acked"] and not refused
    s, r = books["s"].batches, books["r"].batches
    request = s.close(1, 0, r.address, 0.0)
    assert request is not None and len(request.hop_keys) == 3
    assert s.answered(request, PEER["r"], r.countersign(request, s.address), "")


def uncompressed_spelling(key: bytes) -> str:
    """Another peer id of the same node key: the identity multihash of it uncompressed."""
    public = identity_from_key(key).public_key
    raw = crypto_pb2.PublicKey(
        key_type=crypto_pb2.KeyType.Secp256k1, data=public.impl.format(compressed=False)
    ).SerializeToString()
    return base58.b58encode(bytes([0, len(raw)]) + raw).decode()


def test_a_hop_whose_origin_is_another_spelling_of_the_data_nodes_key_is_refused(
    tmp_path: Path,
) -> None:
    """Closes and reports go to a data node at the origin peer id its hops carry: a relay
    passing on another spelling of that node's key (one no host answers to) has its hop
    refused, and no spelling but the key's own names a node."""
    alias = uncompressed_spelling(KEYS["data"])
    assert alias != PEER["data"] and ID.from_base58(alias).extract_public_key() is not None
    with pytest.raises(ProtocolError, match="own spelling"):
        address_of_peer(alias)
    with pytest.raises(TryTokenError):
        origin_address(alias)
    receiver = DataPlane(EchoRpc(), PEER["r"], 1, 2, 5.0, 1 << 20)  # type: ignore[arg-type]
    receiver.use_receipts(book_of(tmp_path, "r"))
    receiver.try_tokens.check = lambda header: None  # type: ignore[method-assign]
    path = (alias, PEER["s"])
    with pytest.raises(HopRejected, match="own peer id"):
        receiver._check_sender(PEER["s"], HopHeader(1, 0, 1, 0, FORWARD, 2, 0, 0, alias, path))
    honest = HopHeader(1, 0, 1, 0, FORWARD, 2, 0, 0, PEER["data"], (PEER["data"], PEER["s"]))
    receiver._check_sender(PEER["s"], honest)
    # A receipt recorded with that origin (passed in by hand) routes nothing to it either.
    book = book_of(tmp_path, "s")
    hop = HopFacts(
        epoch=0, data_node=PEER["data"], iteration=0, microbatch_id=1, stage=2,
        direction=FORWARD, attempt=0, worker=PEER["s"], counterparty=PEER["data"],
        input_digest=keccak(b"i"), output_digest=keccak(b"o"),
    )  # fmt: skip
    receipt = book.receipt(hop)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(book.run, EchoRpc())
            assert await book.record(receipt, PEER["data"], alias)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert book._peers[receipt.dataNode] == PEER["data"]  # the counterparty's, authenticated
