"""Disputes no jury could rule, as the nodes act on them on the real contracts: the challenger's
audit reopens its own once within the grace, drawn with a salt the first case did not reveal;
the accused worker's node, and an auditor, thaw the stake once the grace is over; its status
and earnings say what holds the stake until when. No juror has joined, so every case ends
REFUSED."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from gwtf.api.schemas import Earnings
from gwtf.contracts.fraud_proofs import FraudProof
from gwtf.errors import ChainError
from gwtf.node.audit import jury as court_jury
from gwtf.node.audit.challenge import DISPUTED, JUDGED_BEFORE, REOPENED, Challenges, challenge
from gwtf.node.audit.checks import Finding
from gwtf.node.chain import holds
from gwtf.node.chain.actions import Contracts, request_unstake, withdraw_stake
from gwtf.node.chain.adapter import Sender
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.chain.holds import (
    REORG_BLOCKS,
    DisputeWatch,
    first_dispute_block,
    holds_of,
    release_expired,
    stake_holds,
    thaw_before_withdrawal,
)
from gwtf.node.local_api.snapshot import SnapshotBox
from gwtf.node.local_api.views import NodeViews
from gwtf.node.local_api.watcher import ChainReader, node_view
from gwtf.node.receipts.epochs import WorkerEpochs
from gwtf.node.store.database import open_database
from gwtf.node.store.views import NodeRecords
from tests.contracts import jury
from tests.contracts.conftest import Certified
from tests.contracts.test_tensor_disputes import NO_JURY, dispute_of, state_of
from tests.contracts.world import ETH, TEST_GAS_LIMIT, World


def suite_of(w: World) -> Contracts:
    return Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court, gas_limit=TEST_GAS_LIMIT)


def audit(c: Certified, proof: FraudProof) -> Challenges:
    """The challenger's ``gwtf-node audit --challenge`` on its one finding."""
    finding = Finding("wrong tensor", c.a.address, "re-executed outside the tolerance", proof)
    return challenge(suite_of(c.w), Sender.unlocked(c.w.challenger), [finding])


def serve(w: World, wallet: str) -> list[court_jury.Step]:
    """One ``gwtf-node jury serve`` pass of ``wallet`` (no juror node: no votes)."""
    return trio.run(court_jury.serve_once, suite_of(w), Sender.unlocked(wallet), [], None)


def refuse(w: World, case_id: int) -> bytes:
    """Drives a case with no juror pool to REFUSED, its challenger's node revealing its draw
    salt; returns that salt, as the court took it."""
    window = jury.phase_blocks(w)
    jury.mine_to(w, int(jury.case(w, case_id)[2]) + window + 1)  # the accused stays silent
    assert court_jury.SALT_REVEALED in [s.action for s in serve(w, w.challenger)]
    (revealed,) = w.court.events.SaltRevealed.get_logs(
        argument_filters={"caseId": case_id}, from_block=0
    )
    jury.mine_to(w, int(jury.rounds(w, case_id)[0][1]) + 1)  # no draw within its patience
    assert court_jury.RULED_STEP in [s.action for s in serve(w, w.stranger)]
    assert jury.phase(w, case_id) == jury.RULED
    return bytes(revealed["args"]["salt"])


def frozen(w: World, c: Certified) -> int:
    return int(w.call(w.registry.functions.frozenCount(c.a.address)))


def test_the_challenger_reopens_its_refused_dispute_once_with_a_salt_of_its_own(
    certified: Certified,
) -> None:
    """At stake: the run's 1 ETH minimum of a's stake, and a fair second draw. The first case
    revealed the challenger's draw salt on chain: had the reopening reused it, the accused
    could answer knowing it and pick its jury wherever the beacon adds nothing. The audit run
    in the grace reopens the dispute (not "already judged"), the court takes the new salt,
    and a second REFUSED ends it: a reopening is not reopened."""
    c, w = certified, certified.w
    proof = dispute_of(c, c.a)
    (first,) = audit(c, proof).judgements
    assert first.outcome == DISPUTED and "tensor dispute 1 " in first.detail
    first_salt = refuse(w, 1)
    assert state_of(w, 1) == NO_JURY
    w.travel_to(w.epoch_times(c.run, 0)[3])  # the epoch has settled; the grace lasts
    (again,) = audit(c, proof).judgements
    assert again.outcome == REOPENED and "tensor dispute 2 " in again.detail
    assert w.call(w.disputes.functions.isReopening(2))
    (case,) = court_jury.open_cases(suite_of(w))
    assert (case.dispute_id, case.reopens) == (2, 1)
    second_salt = refuse(w, case.case_id)  # revealSalt takes it: it matches the commitment
    assert second_salt != first_salt
    # One freeze, kept by the reopening and thawed by its ruling; nothing left to release.
    assert frozen(w, c) == 0 and stake_holds(suite_of(w), c.a.address) == []
    (last,) = audit(c, proof).judgements
    assert last.outcome == JUDGED_BEFORE and "dispute 2" in last.detail


def test_a_reopened_dispute_holds_the_stake_past_the_first_grace_and_none_releases_it(
    certified: Certified,
) -> None:
    """A cheater's accomplice would release the stake under the reopened dispute once the
    first grace has passed: the first dispute's grace was ended by the reopening, so the
    node sees only the open reopened dispute and a release reverts."""
    c, w = certified, certified.w
    proof = dispute_of(c, c.a)
    audit(c, proof)
    refuse(w, 1)
    until = int(w.call(w.disputes.functions.reopenUntil(1)))
    assert audit(c, proof).judgements[0].outcome == REOPENED
    w.travel_to(until + 1)
    contracts = suite_of(w)
    (hold,) = stake_holds(contracts, c.a.address)
    assert (hold.dispute_id, hold.until) == (2, None)
    assert release_expired(contracts, Sender.unlocked(w.stranger), [hold]) == []
    assert frozen(w, c) == 1


def earnings(c: Certified, tmp_path: Path) -> Earnings:
    """a's earnings as its API and ``gwtf-node earnings`` show them (its database, the chain)."""
    contracts = suite_of(c.w)
    db = open_database(f"sqlite:///{tmp_path / 'a.sqlite'}")
    try:
        records = NodeRecords(db)
        reader = ChainReader(contracts, EpochLedger(contracts, c.run, None), records, c.a.address)
        return NodeViews(SnapshotBox(chain=reader.read()), records, c.run, c.a.address).earnings()
    finally:
        db.close()


def test_the_workers_node_thaws_its_stake_once_the_grace_is_over_and_says_until_when(
    certified: Certified, tmp_path: Path
) -> None:
    """At stake: a's whole 2 ETH, frozen for good unless someone calls releaseAfterGrace.
    While the challenger may reopen, a's status and earnings show the hold and its end, and
    its node releases nothing; once the grace is over its claim loop releases it, once."""
    c, w = certified, certified.w
    audit(c, dispute_of(c, c.a))
    (held,) = earnings(c, tmp_path).stake_holds
    assert (held.dispute_id, held.until) == (1, None) and "until the court rules" in held.detail
    refuse(w, 1)
    contracts = suite_of(w)
    until = int(w.call(w.disputes.functions.reopenUntil(1)))
    assert [h.until for h in earnings(c, tmp_path).stake_holds] == [until]
    unused: Any = None
    ledger = EpochLedger(contracts, c.run, Sender.unlocked(w.wallet(0)))
    worker = WorkerEpochs(
        unused, c.a.address, ledger, unused, unused, unused, unused, unused, 1.0
    )  # fmt: skip
    view = node_view(contracts, c.a.address)
    assert view is not None
    (shown,) = view.stake_holds
    assert (shown.dispute_id, shown.until, shown.releasable) == (1, until, False)
    assert shown.detail.startswith("stake frozen by dispute 1 (run 1, epoch 0) until ")
    assert trio.run(worker.release_graces) == [] and frozen(w, c) == 1
    w.travel_to(until + 1)
    w.mine()
    view = node_view(contracts, c.a.address)
    assert view is not None and view.stake_holds[0].releasable
    assert trio.run(worker.release_graces) == [1] and frozen(w, c) == 0
    assert trio.run(worker.release_graces) == []
    view = node_view(contracts, c.a.address)
    assert view is not None and view.stake_holds == []
    assert earnings(c, tmp_path).stake_holds == []


def test_the_auditor_thaws_an_accused_stake_whose_grace_is_over(certified: Certified) -> None:
    """The accused's node may be gone for good: the auditor's next run on the epoch releases
    the hold it sees, and reports its own dispute as judged."""
    c, w = certified, certified.w
    proof = dispute_of(c, c.a)
    audit(c, proof)
    refuse(w, 1)
    w.travel_to(int(w.call(w.disputes.functions.reopenUntil(1))) + 1)
    done = audit(c, proof)
    assert done.judgements[0].outcome == JUDGED_BEFORE and done.released == [1]
    assert frozen(w, c) == 0 and holds_of(suite_of(w), [1]) == []


def test_withdraw_thaws_a_hold_whose_grace_is_over_and_names_one_that_lasts(
    certified: Certified,
) -> None:
    """a leaves while a dispute no jury sat on holds its stake: ``gwtf-node withdraw`` says
    which dispute holds it until when (instead of StakeFrozen), then, once the grace and the
    unbonding are over, releases the hold itself and withdraws the whole 2 ETH."""
    c, w = certified, certified.w
    audit(c, dispute_of(c, c.a))
    refuse(w, 1)
    contracts, wallet = suite_of(w), Sender.unlocked(w.wallet(0))
    request_unstake(contracts, wallet, c.a.address)
    until = int(w.call(w.disputes.functions.reopenUntil(1)))
    unlock_at = int(w.call(w.registry.functions.unlockAt(c.a.address)))
    with pytest.raises(ChainError, match=r"stake frozen by dispute 1 \(run 1, epoch 0\) until"):
        thaw_before_withdrawal(contracts, wallet, c.a.address)
    w.travel_to(max(until, unlock_at) + 1)
    w.mine()
    assert thaw_before_withdrawal(contracts, wallet, c.a.address) == [1]
    receipt = withdraw_stake(contracts, wallet, c.a.address)
    (event,) = w.registry.events.StakeWithdrawn().process_receipt(receipt)
    assert int(event["args"]["amountWei"]) == 2 * ETH


def test_dispute_events_are_read_from_the_first_dispute_and_holds_only_under_a_freeze(
    certified: Certified, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain long before its first dispute is not read: the holds and the jury's cases are
    read from the first case's block, and a node whose stake no dispute froze reads no event
    at all (the registry counts its freezes)."""
    c, w = certified, certified.w
    contracts = suite_of(w)
    asked: list[tuple[str, Any]] = []
    request = w.w3.manager.request_blocking

    def counted(method: str, params: Any, *args: object, **kwargs: object) -> object:
        asked.append((method, params))
        return request(method, params, *args, **kwargs)  # type: ignore[arg-type]

    def from_blocks() -> list[int]:
        return [int(p[0]["fromBlock"], 16) for m, p in asked if m == "eth_getLogs"]

    monkeypatch.setattr(w.w3.manager, "request_blocking", counted)
    watch = DisputeWatch(contracts, c.a.address)
    assert watch.holds() == [] and court_jury.open_cases(contracts) == [] and from_blocks() == []
    jury.mine_to(w, w.w3.eth.block_number + 3 * REORG_BLOCKS)  # a long chain before the dispute
    audit(c, dispute_of(c, c.a))
    first = first_dispute_block(contracts)
    assert first is not None and first > 3 * REORG_BLOCKS
    asked.clear()
    (hold,) = watch.holds()
    assert hold.dispute_id == 1 and stake_holds(contracts, c.a.address) == [hold]
    (case,) = court_jury.open_cases(contracts)
    assert case.dispute_id == 1
    assert from_blocks() and min(from_blocks()) >= first - REORG_BLOCKS
    asked.clear()
    assert DisputeWatch(contracts, c.b.address).holds() == [] and from_blocks() == []


def test_the_jurys_cases_are_read_in_chunks_of_blocks(
    certified: Certified, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Providers cap the block range of one ``eth_getLogs``: the open cases are read a few
    blocks at a time, and found all the same."""
    c, w = certified, certified.w
    contracts = suite_of(w)
    audit(c, dispute_of(c, c.a))
    jury.mine_to(w, w.w3.eth.block_number + 10)
    ranges: list[tuple[int, int]] = []
    request = w.w3.manager.request_blocking

    def counted(method: str, params: Any, *args: object, **kwargs: object) -> object:
        if method == "eth_getLogs":
            ranges.append((int(params[0]["fromBlock"], 16), int(params[0]["toBlock"], 16)))
        return request(method, params, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(w.w3.manager, "request_blocking", counted)
    monkeypatch.setattr(holds, "LOG_CHUNK_BLOCKS", 4)
    (case,) = court_jury.open_cases(contracts)
    assert case.dispute_id == 1
    assert len(ranges) > 2 and all(to - start < 4 for start, to in ranges)
