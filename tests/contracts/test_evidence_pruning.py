"""A relay deletes an epoch's hop evidence once the epoch settles on chain and its tensor
disputes are ruled, and not a second before: until ``settlesAt`` a dispute of its hops can be
opened, and until the court rules its jurors re-execute from the frames and the weights
(missing evidence loses). Real contracts on eth-tester, a real archive on disk."""

from __future__ import annotations

from pathlib import Path

import trio

from gwtf.node.chain.adapter import Web3Chain
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.composition import evidence_epochs_of
from gwtf.node.receipts.evidence import SETTLED_MARGIN_S, prune_settled_evidence
from gwtf.node.store.evidence import EvidenceArchive, run_folder
from tests.contracts import jury
from tests.contracts.conftest import Certified, Juried, Staffed
from tests.contracts.test_node_epoch_cycle import suite_of
from tests.contracts.test_tensor_disputes import dispute_of


def keep_three_epochs(root: Path) -> EvidenceArchive:
    archive = EvidenceArchive(root, keep_epochs=4)
    for epoch in (0, 1, 2):
        archive.keep_frame(epoch, f"a frame of epoch {epoch}".encode())
        archive.keep_state(
            epoch, 10 * epoch, lambda: lambda path: path.write_bytes(b"w" * 1000), bool
        )
    return archive


def prune_once(archive: EvidenceArchive, ledger: EpochLedger, now: int) -> None:
    """The first pass in full, this run's and the other runs': the loop reads the chain's time
    once before each, so its third reading starts the next pass (this run's again, the same
    deletions), when the first is over however long a loaded machine took over it."""
    readings = 0

    async def one_pass() -> None:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:

                def chain_now() -> int:
                    nonlocal readings
                    readings += 1
                    if readings == 3:
                        nursery.cancel_scope.cancel()
                    return now

                nursery.start_soon(prune_settled_evidence, archive, ledger, chain_now, 0.0)

    trio.run(one_pass)
    assert readings == 3, "the first pass did not read the chain's time twice"


def test_an_epoch_s_evidence_goes_when_the_epoch_settles(staffed: Staffed, tmp_path: Path) -> None:
    w, run = staffed.w, staffed.run
    ledger = EpochLedger(suite_of(w), run, None)
    archive = keep_three_epochs(tmp_path / "evidence")
    settles = [w.epoch_times(run, epoch)[3] for epoch in (0, 1, 2)]

    prune_once(archive, ledger, settles[0] - 1)  # epoch 0 can still be disputed and ruled on
    assert archive.kept_epochs() == [0, 1, 2]
    assert archive.state(0, 0) == b"w" * 1000
    # Settled, but a reorg of the last blocks could still bring in a dispute opened before.
    prune_once(archive, ledger, settles[0] + SETTLED_MARGIN_S - 1)
    assert archive.kept_epochs() == [0, 1, 2]

    prune_once(archive, ledger, settles[0] + SETTLED_MARGIN_S)
    assert archive.kept_epochs() == [1, 2]
    assert archive.state(0, 0) is None and archive.bytes_of(0) == 0
    assert archive.bytes_of(1) > 1000

    prune_once(archive, ledger, settles[2] + 3600)  # a node started again long after
    assert archive.kept_epochs() == []


def test_an_epoch_under_dispute_keeps_its_evidence_until_the_ruling(
    juried: Juried, tmp_path: Path
) -> None:
    """A dispute of a hop of epoch 0 outlasts the epoch: its evidence stays for the jurors
    until the court rules, then goes."""
    c, w = juried, juried.w
    ledger = EpochLedger(suite_of(w), c.run, None)
    archive = keep_three_epochs(tmp_path / "evidence")
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    settles = w.epoch_times(c.run, 0)[3]
    prune_once(archive, ledger, settles + 3600)
    assert 0 in archive.kept_epochs() and archive.state(0, 0) == b"w" * 1000
    # The challenger never reveals its draw salt: once its window is over, ruled RIGHT.
    jury.mine_to(w, int(jury.case(w, case_id)[2]) + 2 * jury.phase_blocks(w) + 1)
    jury.execute(w, case_id)
    prune_once(archive, ledger, settles + 3600)
    assert 0 not in archive.kept_epochs()


def test_a_dispute_ruled_without_a_jury_keeps_its_evidence_while_it_may_be_reopened(
    certified: Certified, tmp_path: Path
) -> None:
    """A dispute no jury sat on (REFUSED) may be reopened by its challenger until
    reopenUntil, and a reopened dispute is judged from the same evidence: the epoch's evidence
    stays through that grace, then goes."""
    c, w = certified, certified.w
    ledger = EpochLedger(suite_of(w), c.run, None)
    archive = keep_three_epochs(tmp_path / "evidence")
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    jury.mine_to(w, int(jury.rounds(w, case_id)[0][1]) + 1)  # no pool: never drawn
    w.tx(w.court.functions.executeRuling(case_id), w.stranger)
    assert ledger.c.disputes.functions.openTensorDisputes(c.run, 0).call() == 0
    until = int(ledger.c.disputes.functions.reopenableUntil(c.run, 0).call())
    settles = w.epoch_times(c.run, 0)[3]
    assert until > settles + SETTLED_MARGIN_S
    prune_once(archive, ledger, until)
    assert 0 in archive.kept_epochs() and archive.state(0, 0) == b"w" * 1000
    prune_once(archive, ledger, until + 1)
    assert 0 not in archive.kept_epochs()


def test_a_chain_that_does_not_answer_prunes_nothing(staffed: Staffed, tmp_path: Path) -> None:
    class Unreachable(EpochLedger):
        def epoch_times(self, epoch: int):  # type: ignore[no-untyped-def]
            raise OSError("connection refused")

    archive = keep_three_epochs(tmp_path / "evidence")
    prune_once(archive, Unreachable(suite_of(staffed.w), staffed.run, None), 2**40)
    assert archive.kept_epochs() == [0, 1, 2]


def test_the_node_s_other_runs_on_this_chain_are_pruned_too(
    staffed: Staffed, tmp_path: Path
) -> None:
    # A node that left a run before it settled: nothing else would ever delete its evidence.
    w = staffed.w
    suite = suite_of(w)
    chain_id, address = w.w3.eth.chain_id, suite.ledger.address
    later = w.open_run()
    ledger, its = EpochLedger(suite, staffed.run, None), EpochLedger(suite, later, None)
    start, later_start = ledger.run_start_and_length()[0], its.run_start_and_length()[0]
    evidence = tmp_path / "evidence"
    archive = keep_three_epochs(evidence / run_folder(chain_id, address, staffed.run, start))
    other = keep_three_epochs(evidence / run_folder(chain_id, address, later, later_start))
    untouchable = [
        evidence / run_folder(chain_id, address, later, later_start + 1),  # another deployment
        evidence / run_folder(chain_id, address, later + 5, later_start),  # no such run here
        evidence / run_folder(chain_id + 1, address, later, later_start),  # another chain
    ]
    for folder in untouchable:
        keep_three_epochs(folder)

    now = w.epoch_times(later, 1)[3] + SETTLED_MARGIN_S
    prune_once(archive, ledger, now)
    assert other.kept_epochs() == [2]
    assert all(EvidenceArchive(f, keep_epochs=4).kept_epochs() == [0, 1, 2] for f in untouchable)
    open_here = [e for e in (0, 1, 2) if w.epoch_times(staffed.run, e)[3] + SETTLED_MARGIN_S > now]
    assert archive.kept_epochs() == open_here and open_here != [0, 1, 2]

    prune_once(archive, ledger, w.epoch_times(later, 2)[3] + SETTLED_MARGIN_S)
    assert not other.root.exists()  # pruned whole, its folder too
    assert archive.root.exists()  # this run's folder stays for the hops still to come
    assert all(EvidenceArchive(f, keep_epochs=4).kept_epochs() == [0, 1, 2] for f in untouchable)


def test_a_disputed_epoch_keeps_its_evidence_however_many_epochs_follow(
    juried: Juried, tmp_path: Path
) -> None:
    """A relay working on in the run takes hops of ever later epochs: none of them deletes the
    evidence of an epoch whose dispute the jurors have not ruled yet (a juror that finds
    nothing votes WRONG, and the honest relay would lose its stake)."""
    c, w = juried, juried.w
    ledger = EpochLedger(suite_of(w), c.run, None)
    run = Web3Chain(w.registry, w.ledger).run_info(c.run)
    assert run is not None
    keep = evidence_epochs_of(run)  # what the node takes by default: the challenge window
    now = {"epoch": 0}
    archive = EvidenceArchive(tmp_path / "evidence", keep, lambda: now["epoch"])
    digest = archive.keep_frame(0, b"epoch 0 output frame")
    jury.open_case(w, dispute_of(c, c.a))
    assert ledger.c.disputes.functions.openTensorDisputes(c.run, 0).call() == 1
    for epoch in range(1, 3 * keep):
        now["epoch"] = epoch
        archive.keep_frame(epoch, f"a hop of epoch {epoch}".encode())
        if epoch == keep:  # the count the relay takes hops of is past epoch 0
            prune_once(archive, ledger, w.epoch_times(c.run, 0)[3] + SETTLED_MARGIN_S)
    assert archive.frame(0, digest) == b"epoch 0 output frame"
    assert archive.frame_chunk(0, digest, 0, 5) is not None
