"""The tensor disputes that hold a node's stake frozen, and thawing those whose grace is over.

A tensor dispute freezes its accused worker's stake until the court rules
(``Disputes.openTensorDispute``). A first dispute no jury could be drawn for is ruled REFUSED
and keeps the stake frozen until ``Disputes.reopenUntil(id)``, while its challenger may reopen
it once; after that anyone may thaw the stake with ``releaseAfterGrace(id)``. Nobody is paid
to call it, so a worker's node calls it for itself (``WorkerEpochs``, ``gwtf-node withdraw``)
and an auditor for the disputes it sees; ``status`` and ``earnings`` show what holds a stake.

Why the release cannot free a cheater early: the contract refuses it until ``reopenUntil`` has
passed, and a reopening sets ``reopenUntil`` to 0 first (the reopened dispute holds the freeze
until its own ruling). Why it cannot hold an honest worker longer: each release thaws exactly
the one freeze its dispute kept, once (``reopenUntil`` is zeroed), and only after the grace.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from gwtf.contracts.bindings import ContractRevert
from gwtf.errors import ChainError
from gwtf.node.chain.actions import Contracts, release_after_grace
from gwtf.node.chain.adapter import Sender

#: ``Disputes.DisputeState``: Open, and NoJury (ruled REFUSED).
OPEN: Final = 1
NO_JURY: Final = 4
#: Blocks read again at each reading, so that logs of a reorganised chain are read anew.
REORG_BLOCKS: Final = 64
#: Blocks asked for in one ``eth_getLogs`` (providers cap the range), and chunks per reading:
#: a watch far behind catches up over several readings, each of them short.
LOG_CHUNK_BLOCKS: Final = 5_000
CHUNKS_PER_READING: Final = 20


@dataclass(frozen=True)
class StakeHold:
    """One tensor dispute that keeps ``worker``'s stake from being withdrawn: open (``until``
    None: until the court rules), or ruled without a jury and reopenable until ``until``."""

    dispute_id: int
    run_id: int
    epoch: int
    worker: str
    until: int | None

    def releasable(self, now: int) -> bool:
        """Whether ``releaseAfterGrace`` thaws it in a block after one of time ``now``."""
        return self.until is not None and now > self.until

    def describe(self, now: int) -> str:
        where = f"(run {self.run_id}, epoch {self.epoch})"
        if self.until is None:
            return f"stake frozen by dispute {self.dispute_id} {where} until the court rules"
        if self.releasable(now):
            return (
                f"stake frozen by dispute {self.dispute_id} {where}: its grace ended "
                f"{_utc(self.until)}; the running node releases it, as does `gwtf-node withdraw`"
            )
        return f"stake frozen by dispute {self.dispute_id} {where} until {_utc(self.until)}"


@dataclass
class DisputeWatch:
    """The tensor disputes opened against ``worker``, read incrementally from the
    ``TensorDisputeOpened`` events (the worker is not an indexed topic: each reading asks for
    the blocks since the last, and ``REORG_BLOCKS`` before), from the block of the first
    dispute (``first_dispute_block``) on. While the registry holds no freeze of the worker's
    stake, nothing holds it and no event is read."""

    contracts: Contracts
    worker: str
    next_block: int | None = None  # None: from the first dispute's block, once there is one

    def __post_init__(self) -> None:
        self._ids: set[int] = set()
        self._over: set[int] = set()  # ruled for good, or released: they hold nothing again

    def holds(self, whole: bool = False) -> list[StakeHold]:
        """What holds the worker's stake now (``holds_of`` the disputes not over; ``whole``:
        with every event read, however far behind)."""
        # Each hold keeps exactly one freeze of the stake (an open dispute, or one ruled
        # without a jury in its grace; a reopening keeps its prior's): no freeze, no hold.
        if int(self.contracts.registry.functions.frozenCount(self.worker).call()) == 0:
            return []
        ids = [i for i in self.ids(whole) if i not in self._over]
        holds = holds_of(self.contracts, ids)
        self._over |= set(ids) - {hold.dispute_id for hold in holds}
        return holds

    def ids(self, whole: bool = False) -> list[int]:
        """The disputes seen so far (``whole``: read up to the latest block, however far)."""
        if self.next_block is None:
            self.next_block = first_dispute_block(self.contracts)
            if self.next_block is None:
                return []
        while True:
            latest = int(self.contracts.w3.eth.block_number)
            caught_up = self.next_block > latest - LOG_CHUNK_BLOCKS
            start = max(0, self.next_block - REORG_BLOCKS) if caught_up else self.next_block
            end = min(latest, start + LOG_CHUNK_BLOCKS * CHUNKS_PER_READING - 1)
            worker = self.worker.lower()
            for chunk in range(start, end + 1, LOG_CHUNK_BLOCKS):
                logs = self.contracts.disputes.events.TensorDisputeOpened.get_logs(
                    from_block=chunk, to_block=min(end, chunk + LOG_CHUNK_BLOCKS - 1)
                )
                args = [log["args"] for log in logs]
                self._ids |= {int(a["id"]) for a in args if str(a["worker"]).lower() == worker}
            self.next_block = max(self.next_block, end + 1)
            if not whole or end >= latest:
                return sorted(self._ids)


def first_dispute_block(contracts: Contracts) -> int | None:
    """The block of the first tensor dispute, where reading dispute events begins; None while
    there is none. Every dispute opens a court case (numbered from 1) in its own transaction,
    and the court only takes cases from the wired ``Disputes``: no dispute event is older than
    case 1."""
    court = contracts.court.functions
    if int(court.caseCount().call()) == 0:
        return None
    # Case: parties, arbitrable, openedAt (its block), ...
    return int(court.getCase(1).call()[2])


def logs_since(event: Any, first: int, latest: int) -> list[Any]:
    """Every log of ``event`` (a contract's event, e.g. ``disputes.events.X``) in blocks
    ``first .. latest``, asked for ``LOG_CHUNK_BLOCKS`` at a time (providers cap the range)."""
    logs: list[Any] = []
    for chunk in range(first, latest + 1, LOG_CHUNK_BLOCKS):
        to_block = min(latest, chunk + LOG_CHUNK_BLOCKS - 1)
        logs.extend(event.get_logs(from_block=chunk, to_block=to_block))
    return logs


def holds_of(contracts: Contracts, dispute_ids: Iterable[int]) -> list[StakeHold]:
    """The disputes among ``dispute_ids`` that hold their worker's stake now."""
    disputes = contracts.disputes.functions
    holds = []
    for dispute_id in dispute_ids:
        dispute = disputes.tensorDisputes(dispute_id).call()
        # TensorDispute: challenger, state, epoch, worker, order, runId, ...
        state, epoch, worker, run_id = int(dispute[1]), int(dispute[2]), dispute[3], int(dispute[5])
        if state == OPEN:
            holds.append(StakeHold(dispute_id, run_id, epoch, str(worker), None))
        elif state == NO_JURY:
            until = int(disputes.reopenUntil(dispute_id).call())
            if until != 0:  # 0: reopened (the reopening holds it), or released
                holds.append(StakeHold(dispute_id, run_id, epoch, str(worker), until))
    return holds


def stake_holds(contracts: Contracts, worker: str) -> list[StakeHold]:
    """What holds ``worker``'s stake now, read from the whole chain."""
    return DisputeWatch(contracts, worker).holds(whole=True)


def chain_now(contracts: Contracts) -> int:
    return int(contracts.w3.eth.get_block("latest")["timestamp"])


def release_expired(contracts: Contracts, sender: Sender, holds: Iterable[StakeHold]) -> list[int]:
    """Send ``releaseAfterGrace`` for each hold whose grace is over; the disputes released.
    One another caller released first (``NotReopenable``) is skipped."""
    now = chain_now(contracts)
    released = []
    for hold in holds:
        if not hold.releasable(now):
            continue
        try:
            release_after_grace(contracts, sender, hold.dispute_id)
        except ContractRevert as exc:
            if exc.name != "NotReopenable":
                raise
            continue
        released.append(hold.dispute_id)
    return released


def thaw_before_withdrawal(contracts: Contracts, wallet: Sender, node: str) -> list[int]:
    """Release each hold on ``node``'s stake whose grace is over (the disputes released), and
    refuse with what still holds it and until when: its withdrawal would revert
    ``StakeFrozen``."""
    holds = stake_holds(contracts, node)
    released = release_expired(contracts, wallet, holds)
    held = [hold for hold in holds if hold.dispute_id not in released]
    if held:
        now = chain_now(contracts)
        what = "; ".join(hold.describe(now) for hold in held)
        raise ChainError(f"{what}: withdraw after that")
    return released


def _utc(unix_s: int) -> str:
    moment = datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")
