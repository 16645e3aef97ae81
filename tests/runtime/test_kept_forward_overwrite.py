"""A made-up repair-flagged forward for a microbatch a relay holds must not replace the saved
forward its real gradient is computed through.

Relay ``r`` (stage 1 of 2) holds microbatch 7's forward (as a stand-in, from a repair whose
kept receipt it recorded, or on the path). Run member ``s``, with the try's
token a colluder on the path leaked (``try_token.py``), sends it a made-up repair of
microbatch 7 with another input X2. Computed, it would replace r's saved activations: the real
gradient would then be backpropagated through X2, poisoning the stage, and r's backward receipt
would replay from no forward receipt of r's (a stand-in convicted of a wrong tensor it computed
honestly). ``r`` declines it, and the gradient goes through X1.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import trio
from eth_utils.crypto import keccak
from sqlalchemy import select

from gwtf.contracts.encoding import FORWARD as RECEIPT_FORWARD
from gwtf.contracts.encoding import HopReceipt, ledger_domain
from gwtf.coordinator_free.wire import HopAck, encode
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.p2p.rpc import Decline
from gwtf.node.receipts.batch_closing import CLOSE_PROTOCOL
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.recording import ReceiptBook
from gwtf.node.runtime.dataplane.exchange import PROTOCOL_ID, DataPlane
from gwtf.node.runtime.dataplane.hop import (
    BACKWARD,
    FLAG_REPAIR,
    FORWARD,
    HopHeader,
    ReceiptInput,
    decode_hop_request,
    frame_digest,
)
from gwtf.node.runtime.dataplane.try_token import NO_CHAIN_TRY_DOMAIN, sign_try
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.store.batches import WORKER, BatchStore
from gwtf.node.store.database import open_database
from gwtf.node.store.models import BatchedReceipt
from gwtf.node.training import codec
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import named_config
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker

DOMAIN = ledger_domain(31337, "0x" + "ef" * 20)
TERMS = ReceiptTerms(run_id=1, domain=DOMAIN, stages=2, units_per_hop=10)
KEYS = {name: keccak(text=f"kept overwrite {name}") for name in ("d", "r", "s", "t")}
PEER = {name: str(peer_id_of(identity_from_key(key))) for name, key in KEYS.items()}
SETTINGS = TrainingSettings(device="cpu")
LIMITS = CodecLimits()
PLAN = plan_partition(named_config("gpt", "tiny"), 2)


class Loop:
    """``me``'s requests, answered by relay ``r``'s plane in process."""

    def __init__(self, me: str, target: DataPlane) -> None:
        self.me, self.target = me, target

    async def open(self, peer: Any, protocol: str, timeout_s: float) -> None:
        pass  # connected: the hop goes at once

    def serve(self, *_: Any) -> None:
        pass  # its batch closes are not this test's

    async def request(self, peer: Any, protocol: str, payload: bytes, limits: Any) -> bytes:
        assert protocol == PROTOCOL_ID
        return await self.target._handle(self.me, payload)


class Capture:
    """``r``'s own sends: its forwards answered by ``stage_2`` when set (its real ack), its
    gradients (and forwards without it) acknowledged and noted; every batch close refused (a
    receiver withholding its countersignature)."""

    def __init__(self) -> None:
        self.sent: list[tuple[HopHeader, ReceiptInput | None, bytes]] = []
        self.stage_2: DataPlane | None = None

    def serve(self, *_: Any) -> None:
        pass

    async def open(self, peer: Any, protocol: str, timeout_s: float) -> None:
        pass  # connected: the hop goes at once

    async def request(self, peer: Any, protocol: str, payload: bytes, limits: Any) -> bytes:
        if protocol == CLOSE_PROTOCOL:
            return b"\x00withheld"
        header, receipted, frame = decode_hop_request(payload)
        if header.direction == FORWARD and self.stage_2 is not None:
            return await self.stage_2._handle(PEER["r"], payload)
        self.sent.append((header, receipted, frame))
        ack = HopAck(
            str(header.microbatch_id), header.stage, header.direction, header.attempt,
            frame_digest(frame),
        )  # fmt: skip
        return encode(ack)


def tried(header: HopHeader) -> HopHeader:
    """``header``, the first forward of a try of data node ``d``'s, with its try token."""
    return sign_try(header, KEYS["d"], NO_CHAIN_TRY_DOMAIN)


def tensor(seed: int) -> torch.Tensor:
    return torch.randn(2, 16, PLAN.config.d_model, generator=torch.Generator().manual_seed(seed))


def stage_2_of(nursery: trio.Nursery, book: ReceiptBook) -> DataPlane:
    """Relay t's plane as stage 2: it records r's forwards before its acks, computes
    nothing."""
    plane = DataPlane(Capture(), PEER["t"], 1, 2, 5.0, 1 << 24)  # type: ignore[arg-type]
    plane.use_receipts(book)

    async def computes_nothing(header: HopHeader, frame: bytes) -> None:
        return None

    plane.compute = computes_nothing
    plane.serve(nursery)
    return plane


def swarm_of(
    tmp_path: Path,
) -> tuple[dict[str, ReceiptBook], Capture, DataPlane, dict[str, DataPlane]]:
    """Receipt books of d, r, s and t; r's plane (its own sends captured); the planes of the
    others, whose requests r answers in process."""
    books = {
        name: ReceiptBook(
            TERMS, KEYS[name], BatchStore(open_database(f"sqlite:///{tmp_path}/{name}"), DOMAIN)
        )
        for name in ("d", "r", "s", "t")
    }
    capture = Capture()
    plane_r = DataPlane(capture, PEER["r"], 1, 2, 5.0, 1 << 24)  # type: ignore[arg-type]
    plane_r.use_receipts(books["r"])
    planes = {
        name: DataPlane(Loop(PEER[name], plane_r), PEER[name], 1, 2, 5.0, 1 << 24)  # type: ignore[arg-type]
        for name in ("d", "s", "t")
    }
    for name, plane in planes.items():
        plane.use_receipts(books[name])
    return books, capture, plane_r, planes


def relay_r(
    nursery: trio.Nursery,
    books: dict[str, ReceiptBook],
    plane_r: DataPlane,
    planes: dict[str, DataPlane],
) -> RelayRole:
    """Relay r of stage 1 on ``plane_r``, the books running, the others' planes in ``nursery``."""
    for name, book in books.items():
        rpc = plane_r.rpc if name == "r" else planes[name].rpc
        nursery.start_soon(book.run, rpc)
    for plane in planes.values():
        plane._nursery = nursery
    heard = SimpleNamespace(heard_from=lambda *_: None, route=lambda *_: None)
    return RelayRole(
        worker=StageWorker(PLAN, 0, SETTINGS, seed=1),
        stage=1,
        plane=plane_r,
        flow=SimpleNamespace(node=heard),  # type: ignore[arg-type]
        averager=None,  # type: ignore[arg-type]
        limits=LIMITS,
        nursery=nursery,
    )


def relay_r_onto_t(
    nursery: trio.Nursery,
    books: dict[str, ReceiptBook],
    plane_r: DataPlane,
    planes: dict[str, DataPlane],
    capture: Capture,
) -> RelayRole:
    """``relay_r`` serving, its forwards sent on to ``t``, whose plane answers them as stage 2
    (recorded)."""
    role = relay_r(nursery, books, plane_r, planes)
    role.sender.next_hop = lambda *_: PEER["t"]  # type: ignore[method-assign]
    capture.stage_2 = stage_2_of(nursery, books["t"])
    plane_r.serve(nursery)
    return role


def test_a_second_repair_under_a_kept_forwards_attempt_does_not_make_the_backward_unreplayable(
    tmp_path: Path,
) -> None:
    books, capture, plane_r, planes = swarm_of(tmp_path)
    x1, x2, grad = tensor(1), tensor(2), tensor(3)
    f1, f2, g = (codec.encode(7, t, LIMITS) for t in (x1, x2, grad))
    attempt = 256  # the data node's first repair block
    repair = tried(HopHeader(1, 0, 7, attempt, FORWARD, 1, 0, FLAG_REPAIR, PEER["d"], (PEER["d"],)))
    made_up = repair.onward(path=(PEER["s"],))  # its try token leaked by a node on the path
    backward = HopHeader(
        1, 0, 7, attempt, BACKWARD, 1, 0, 0, PEER["d"], (PEER["d"], PEER["r"], PEER["t"], PEER["d"])
    )

    recorded: list[HopReceipt] = []
    books["r"].on_signed = recorded.append

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            role = relay_r(nursery, books, plane_r, planes)
            plane_r.serve(nursery)
            await planes["d"].send(PEER["r"], repair, f1)  # the real repair, recorded
            assert plane_r.backward_after(repair, 1, frame_digest(f1))
            with pytest.raises(Decline, match="held here from another input"):
                await planes["s"].send(PEER["r"], made_up, f2)  # made up, same attempt
            await planes["t"].send(PEER["r"], backward, g)
            with trio.fail_after(10):
                while not capture.sent:
                    await trio.sleep(0.01)
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
        assert role is not None

    trio.run(main)
    [(_, receipted, sent_grad)] = capture.sent
    assert receipted is not None  # through its recorded forward: paid once that one is

    # The forwards r can show a juror: the kept ones it recorded.
    forward_inputs = {r.inputDigest for r in recorded if r.direction == RECEIPT_FORWARD}
    assert forward_inputs == {frame_digest(f1)}

    def replay(x: torch.Tensor) -> bytes:
        worker = StageWorker(PLAN, 0, SETTINGS, seed=1)
        worker.forward(7, x)
        return frame_digest(codec.encode(7, worker.backward(7, grad), LIMITS))

    # The gradient r signed replays from the one forward it signed.
    assert frame_digest(sent_grad) == replay(x1) != replay(x2)


def test_a_made_up_repair_after_the_paths_forward_does_not_replace_what_the_backward_uses(
    tmp_path: Path,
) -> None:
    """``r`` computed microbatch 7's forward on the path (X1) and sent it on. Run member
    ``s`` then sends it a made-up repair (X2, an attempt of its choosing): declined. The real
    gradient from stage 2 is backpropagated through X1, receipted."""
    books, capture, plane_r, planes = swarm_of(tmp_path)
    x1, x2, grad = tensor(1), tensor(2), tensor(3)
    f1, f2, g = (codec.encode(7, t, LIMITS) for t in (x1, x2, grad))
    path_forward = tried(HopHeader(1, 0, 7, 0, FORWARD, 1, 0, 0, PEER["d"], (PEER["d"],)))
    # Its try token leaked by a node on the path:
    made_up = path_forward.onward(attempt=9, flags=FLAG_REPAIR, path=(PEER["s"],))
    backward = HopHeader(
        1, 0, 7, 0, BACKWARD, 1, 0, 0, PEER["d"], (PEER["d"], PEER["r"], PEER["t"], PEER["d"])
    )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            role = relay_r_onto_t(nursery, books, plane_r, planes, capture)
            await planes["d"].send(PEER["r"], path_forward, f1)
            with trio.fail_after(10):  # r's forward reached t, its receipt whole
                while not role.buffers[(0, 7)].sent_to:
                    await trio.sleep(0.01)
            with pytest.raises(Decline, match="held here from another input"):
                await planes["s"].send(PEER["r"], made_up, f2)
            await planes["t"].send(PEER["r"], backward, g)
            with trio.fail_after(10):
                while not capture.sent:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main)
    [(_, receipted, sent_grad)] = capture.sent

    def replay(x: torch.Tensor) -> bytes:
        worker = StageWorker(PLAN, 0, SETTINGS, seed=1)
        worker.forward(7, x)
        return frame_digest(codec.encode(7, worker.backward(7, grad), LIMITS))

    assert receipted is not None
    assert frame_digest(sent_grad) == replay(x1), "r backpropagated the made-up forward"


def test_a_backward_through_a_forward_whose_receiver_withheld_its_countersignature_is_unpaid(
    tmp_path: Path,
) -> None:
    """``r`` sends microbatch 7's forward on to a stage-2 node that acknowledges it and then
    refuses its batch. A juror would replay ``r``'s backward with a whole receipt of that
    forward, which ``r`` does not hold: so ``r`` computes the gradient and passes it on, and
    its receipt joins no batch (unpaid, never signed, never slashable)."""
    books, capture, plane_r, planes = swarm_of(tmp_path)
    x1, grad = tensor(1), tensor(3)
    f1, g = (codec.encode(7, t, LIMITS) for t in (x1, grad))
    path_forward = tried(HopHeader(1, 0, 7, 0, FORWARD, 1, 0, 0, PEER["d"], (PEER["d"],)))
    backward = HopHeader(
        1, 0, 7, 0, BACKWARD, 1, 0, 0, PEER["d"], (PEER["d"], PEER["r"], PEER["t"], PEER["d"])
    )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            role = relay_r(nursery, books, plane_r, planes)
            role.sender.next_hop = lambda *_: PEER["t"]  # type: ignore[method-assign]
            plane_r.serve(nursery)
            await planes["d"].send(PEER["r"], path_forward, f1)
            with trio.fail_after(10):
                while not capture.sent:  # its forward, acknowledged with no countersignature
                    await trio.sleep(0.01)
            await planes["t"].send(PEER["r"], backward, g)
            with trio.fail_after(10):
                while len(capture.sent) < 2:
                    await trio.sleep(0.01)
            await books["r"].close_due(iteration_end=True)  # t refuses the forward's batch
            nursery.cancel_scope.cancel()

    trio.run(main)
    (forward, forward_receipt, _), (gradient, gradient_receipt, _) = capture.sent
    assert forward.direction == FORWARD and forward_receipt is not None
    assert gradient.direction == BACKWARD and gradient_receipt is not None
    store, r = books["r"].store, books["r"].address
    assert not books["r"].withholders.may_send(PEER["t"])
    assert [b.batch.counterparty for b in store.batches(1, 0, WORKER, complete=False)] == [
        books["t"].address
    ], "the forward's batch only, never countersigned"
    data_node = books["d"].address
    assert store.open_hops(1, 0, r, data_node, WORKER, 10) == [], "held out of every batch"
    with store.db.sessions() as session:
        (held,) = session.scalars(
            select(BatchedReceipt).where(
                BatchedReceipt.worker == r, BatchedReceipt.counterparty == data_node
            )
        )
    assert held.batch_root is None and held.held, "the backward open, held on disk"
