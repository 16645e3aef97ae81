"""A sampled backward whose forward is not among the certificate's leaves read (the data node cut
its reading inside its colluder's span, and served the backward's leaf alone) is re-executed
all the same with the forward its worker signed and its counterparty countersigned, fetched
from them as a juror does, and a wrong one is a wrong tensor against its worker, not an
``unreplayed`` accusing nobody. A forward the counterparty did not countersign is no forward.
The audit's sampling with its chain and tree checks replaced (pure core), real signatures."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
from eth_account import Account

from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import BACKWARD, FORWARD, HopReceipt, ledger_domain, sign_receipt
from gwtf.node.audit import runner
from gwtf.node.audit.reexecute import Replay
from gwtf.node.receipts.serving import Fetched

DOMAIN = ledger_domain(1, "0x" + "44" * 20)
DATA = "0x" + "33" * 20
W_KEY, C_KEY = b"\x01" * 32, b"\x02" * 32
W, C = Account.from_key(W_KEY).address, Account.from_key(C_KEY).address


def signed(r: HopReceipt, countersigned_by: bytes) -> SignedReceipt:
    return SignedReceipt(
        r, sign_receipt(r, DOMAIN, W_KEY), sign_receipt(r, DOMAIN, countersigned_by)
    )


FORWARD_R = HopReceipt(1, 0, DATA, 3, 7, 1, FORWARD, 0, W, C, b"\5" * 32, b"\6" * 32, 1)
BACKWARD_R = HopReceipt(1, 0, DATA, 3, 7, 1, BACKWARD, 0, W, C, b"\1" * 32, b"\2" * 32, 1)


class Source:
    """Serves every frame and the worker's weights; the worker serves ``forwards`` as its
    signed receipts."""

    def __init__(self, forwards: list[SignedReceipt]) -> None:
        self.forwards = forwards

    async def frame(self, epoch: int, digest: bytes, first: Any) -> bytes:
        return b"frame " + digest[:1]

    async def state(self, epoch: int, iteration: int, nodes: Any) -> Any:
        return (b"state", nodes[0], None) if nodes else None

    async def receipts(self, node: str, epoch: int, which: int) -> list[SignedReceipt]:
        return self.forwards if node == W.lower() else []


class Replayer:
    def __init__(self) -> None:
        self.forward_inputs: list[bytes | None] = []

    def replay(self, evidence: Any) -> Replay:
        self.forward_inputs.append(evidence.forward_input_frame)
        return Replay(False, 0.5, 0.5, True, 0.0, "s")


class Reader:  # serves the sampled backward's leaf alone, as a data node cutting its reading
    async def leaves(self, cert: Any, indices: Any, domain: Any) -> Any:
        leaf = SimpleNamespace(hop=SimpleNamespace(index=5))
        return runner.LeafReading([(SignedReceipt(BACKWARD_R, b"", b""), leaf)], [], [], [])

    def findings(self, cert: Any, unserved: Any, sampled: int) -> list[Any]:
        return []


def audit(monkeypatch: pytest.MonkeyPatch, forwards: list[SignedReceipt]) -> Any:
    monkeypatch.setattr(runner, "verifying_leaves", lambda cert, served, domain: served)
    monkeypatch.setattr(runner, "draw_indices", lambda *args: [5])
    monkeypatch.setattr(runner, "with_root_proofs", lambda cert, served, drawn: drawn)
    replayer = Replayer()
    sampling = runner.Sampling(1, replayer)  # type: ignore[arg-type]
    cert = SimpleNamespace(count=10, dataNode=DATA)
    (done,), found = trio.run(
        runner.replay_certificate, Source(forwards), sampling, b"seed", cert, Fetched(()),
        {DATA.lower()}, DOMAIN, lambda step: None, None, Reader(),
    )  # fmt: skip
    return done, found, replayer


def test_a_backward_cut_from_its_forward_is_replayed_with_the_signed_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    done, found, replayer = audit(monkeypatch, [signed(FORWARD_R, C_KEY)])
    assert done.replay is not None and done.replay.wrong, done.why_not
    assert replayer.forward_inputs == [b"frame \5"]  # the signed forward's input
    assert found == []


def test_a_forward_not_countersigned_is_no_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    done, _, replayer = audit(monkeypatch, [signed(FORWARD_R, W_KEY)])
    assert done.replay is None and "forward" in done.why_not
    assert replayer.forward_inputs == []
