"""A juror's evidence tries end inside its commit window, and an accused that stalls every
request (it is reached, then never answers) is convicted of missing evidence only once it had
its whole retry schedule: with blocks to spare the juror retries, as a busy honest relay needs,
and commits WRONG; when its window cut the schedule short it commits RIGHT (not shown wrong in
time), in time, never retrying past the window to be fined as absent, nor convicting the accused
for its own lateness. A real eth-tester court (a drawn jury in its vote window) and real libp2p
hosts on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from gwtf.node.audit import jury
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.chain.adapter import Sender
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import identity_from_key
from gwtf.node.p2p.rpc import PublicRate, RequestResponse, RpcLimits
from gwtf.node.receipts.evidence import EVIDENCE_PROTOCOL
from tests.contracts import jury as court
from tests.contracts.conftest import Juried
from tests.contracts.test_dispute_graces import suite_of
from tests.contracts.test_tensor_disputes import dispute_of
from tests.served import served_in_a_thread
from tests.training.test_reexecute import SETTINGS, stage_with_kept_state

TIMEOUT_S = 1.0


def juror_pass(j: Juried, tmp_path: Path, blocks_left: int) -> tuple[list[jury.Step], int]:
    """A dispute on a's first forward drawn to its vote; chain mined until ``blocks_left``
    blocks of the commit window are left after the next; one seated juror's pass with a as
    a peer that stalls every evidence request: (the juror's steps, a's evidence requests)."""
    w = j.w
    proof = dispute_of(j, j.a)
    _, case_id = court.open_case(w, proof)
    court.reveal_salt(w, case_id, proof)
    seats = set(court.draw(w, case_id))
    juror = next(juror for juror in j.jurors if juror.node in seats)
    drawn_at = int(court.rounds(w, case_id)[-1][2])
    court.mine_to(w, drawn_at + court.phase_blocks(w) - blocks_left)
    asked: list[str] = []

    @asynccontextmanager
    async def stalling() -> AsyncIterator[str]:
        async with running_host(identity_from_key(j.a.private_key)) as host:

            async def stall(peer: str, _request: bytes) -> bytes:
                asked.append(peer)
                await trio.sleep_forever()
                raise AssertionError("unreachable")

            limits = RpcLimits(128, 1 << 20, 10 * TIMEOUT_S)
            RequestResponse(host).serve(EVIDENCE_PROTOCOL, stall, limits, PublicRate())
            yield full_address(host)

    plan, _, _ = stage_with_kept_state(tmp_path / "juror")
    replayer = Replayer(plan, SETTINGS)
    with served_in_a_thread(stalling) as address:
        steps = trio.run(
            jury.serve_once, suite_of(w), Sender.unlocked(juror.wallet), [address],
            lambda _run: replayer, TIMEOUT_S, 1.0,
        )  # fmt: skip
    return [s for s in steps if s.action in (jury.COMMITTED, jury.FAILED)], len(asked)


def test_a_juror_whose_window_cuts_the_schedule_short_commits_right(
    juried: Juried, tmp_path: Path
) -> None:
    # Four blocks left: two seconds of tries, less than the first try's four request timeouts.
    (step,), asked = juror_pass(juried, tmp_path, blocks_left=4)
    assert step.action == jury.COMMITTED, step
    assert step.detail.startswith("right tensor: not shown wrong in time"), step.detail
    assert asked == 1  # the first try only, cut at the deadline


def test_a_juror_at_its_window_s_last_block_commits_right(juried: Juried, tmp_path: Path) -> None:
    (step,), asked = juror_pass(juried, tmp_path, blocks_left=0)
    assert step.action == jury.COMMITTED, step
    assert step.detail.startswith("right tensor: not shown wrong in time"), step.detail
    assert asked == 0


def test_a_juror_with_blocks_to_spare_still_retries(juried: Juried, tmp_path: Path) -> None:
    (step,), asked = juror_pass(juried, tmp_path, blocks_left=18)
    assert step.action == jury.COMMITTED, step
    assert step.detail.startswith("wrong tensor: missing evidence loses"), step.detail
    assert asked > 1
