"""What the chain says of this node's run, read every few seconds for the API and the CLI.

A ``ChainReader`` (blocking web3, run in a worker thread) reads the chain's time, the windows and
books of every epoch the node worked or claimed in, the rewards paid to it, its run and the
run's slashes. The node's loop keeps the latest reading in its ``SnapshotBox``; ``gwtf-node
earnings`` reads once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from gwtf.api.schemas import Amount, CapacityView, NodeView, RunView, Slashed, StakeHold
from gwtf.contracts.fraud_proofs import Fraud
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.adapter import RunInfo
from gwtf.node.chain.epochs import EpochBook, EpochLedger, EpochTimes
from gwtf.node.chain.holds import DisputeWatch, stake_holds
from gwtf.node.chain.holds import StakeHold as DisputeHold
from gwtf.node.local_api.earnings import ChainView, ClaimRecord, earnings_of, next_claim_at
from gwtf.node.local_api.snapshot import ChainParts, SnapshotBox
from gwtf.node.store.views import NodeRecords

log = logging.getLogger(__name__)


def claim_records(records: NodeRecords, run_id: int) -> list[ClaimRecord]:
    return [
        ClaimRecord(
            c.epoch, c.data_node, c.units, c.status, int(c.amount_wei or 0), c.tx_hash, c.error
        )
        for c in records.claims(run_id)
    ]


#: Blocks read again at each reading, so that logs of blocks a reorganisation replaced go away.
REORG_BLOCKS = 64
#: Blocks asked for in one ``eth_getLogs`` (providers cap the range), and chunks per reading: a
#: node far behind catches up over several readings, each of them short.
LOG_CHUNK_BLOCKS = 5_000
CHUNKS_PER_READING = 20


@dataclass
class EventTail:
    """One event's logs, read incrementally from ``next_block``: each reading asks for the
    blocks since the last (and ``REORG_BLOCKS`` before), in chunks, never the whole chain."""

    fetch: Callable[[int, int], Sequence[Any]]  # (from block, to block) → items with .block
    items: list[Any] = field(default_factory=list)
    next_block: int = 0

    def read(self, latest: int) -> list[Any]:
        caught_up = self.next_block > latest - LOG_CHUNK_BLOCKS
        start = (
            max(0, min(self.next_block, latest + 1) - REORG_BLOCKS)
            if caught_up
            else (self.next_block)
        )
        end = min(latest, start + LOG_CHUNK_BLOCKS * CHUNKS_PER_READING - 1)
        fresh: list[Any] = []
        for chunk in range(start, end + 1, LOG_CHUNK_BLOCKS):
            fresh += self.fetch(chunk, min(end, chunk + LOG_CHUNK_BLOCKS - 1))
        self.items = [item for item in self.items if item.block < start] + fresh
        self.next_block = max(self.next_block, end + 1)
        return list(self.items)


def first_block_at(w3: Any, timestamp: int) -> int:
    """The first block whose time is ``timestamp`` or later (block times never go back): where
    a run opened at that time begins, found in about log2(blocks) reads."""
    low, high = 0, int(w3.eth.block_number)
    while low < high:
        middle = (low + high) // 2
        if int(w3.eth.get_block(middle)["timestamp"]) < timestamp:
            low = middle + 1
        else:
            high = middle
    return low


#: What a reading takes from one block: rewards paid, slashes, the run, the node.
_AtBlock = tuple[list[Any], tuple[Slashed, ...], tuple[RunView, ...], NodeView | None]

#: Chain seconds after which a settled epoch's book that is not closed is read again.
OPEN_BOOK_READ_S = 60


@dataclass
class ChainReader:
    """Reads what the chain says of ``node``'s run. It remembers what can no longer change:
    epoch windows, the books of settled epochs (refreshed when this node is paid in one),
    events already read from the block the run opened in; so a node in a long run asks for the
    epochs still moving and the blocks since its last reading; with no new block since, it
    asks for nothing but the epochs its records name for the first time."""

    contracts: Contracts
    ledger: EpochLedger
    records: NodeRecords
    node: str
    times: dict[int, EpochTimes] = field(default_factory=dict)
    #: Settled epochs' books: (this node's payments then, the book, chain time read).
    settled_books: dict[int, tuple[int, EpochBook, int]] = field(default_factory=dict)
    #: Who certified each epoch whose submissions closed: fixed from then on, read once.
    certified: dict[int, frozenset[str]] = field(default_factory=dict)
    rewards: EventTail = field(init=False)
    slashes: EventTail = field(init=False)
    #: The tensor disputes against this node, in any run (each holds its stake).
    disputes: DisputeWatch = field(init=False)
    _opened_at: int | None = None
    _start_and_length: tuple[int, int] = (0, 0)
    #: The latest block read (number, hash), what was read at it, and the books read at it.
    _block: tuple[Any, Any] = (None, None)
    _at_block: _AtBlock = ([], (), (), None)
    _books: dict[int, EpochBook] = field(default_factory=dict)

    def __post_init__(self) -> None:
        run_id = self.ledger.run_id
        self.rewards = EventTail(lambda a, b: self.ledger.rewards_to(self.node, a, b))
        self.slashes = EventTail(lambda a, b: slashes_of(self.contracts, run_id, a, b))
        self.disputes = DisputeWatch(self.contracts, self.node)

    def read(self) -> ChainParts:
        run_id = self.ledger.run_id
        if self._opened_at is None:
            self._start_and_length = self.ledger.run_start_and_length()
            self._opened_at = first_block_at(self.contracts.w3, self._start_and_length[0])
            self.rewards.next_block = self.slashes.next_block = self._opened_at
        work = self.records.work(run_id)
        claims = claim_records(self.records, run_id)
        block = self.contracts.w3.eth.get_block("latest")
        if (block["number"], block["hash"]) != self._block:
            # Every read below is of the latest block: with no new block, it is the last one's.
            self._at_block = self._read_block(int(block["number"]), int(block["timestamp"]))
            self._block, self._books = (block["number"], block["hash"]), {}
        paid, slashes, runs, node = self._at_block
        epochs = sorted(set(work) | {c.epoch for c in claims} | {p.epoch for p in paid})
        for epoch in epochs:
            if epoch not in self.times:
                self.times[epoch] = self.ledger.epoch_times(epoch)
        now = int(block["timestamp"])  # chain time (``EpochLedger.now``)
        paid_in = Counter(p.epoch for p in paid)
        for epoch in epochs:
            if epoch not in self._books:
                self._books[epoch] = self._book(epoch, now, paid_in[epoch])
        view = ChainView(
            now=now,
            times={e: self.times[e] for e in epochs},
            books={e: self._books[e] for e in epochs},
            paid=paid,
            certified_by={
                e: self._certified_by(e) for e in epochs if now >= self.times[e].submit_closes_at
            },
        )
        earned = earnings_of(run_id, work, claims, view)
        start, length = self._start_and_length
        running = self.ledger.epoch_times(max(0, (now - start) // length)) if length else None
        return ChainParts(
            view=view,
            runs=runs,
            slashes=slashes,
            claimed_wei=sum(int(e.claimed.wei) for e in earned),
            claimable_wei=sum(int(e.claimable.wei) for e in earned),
            next_claim_at=next_claim_at(earned, view.times, running),
            node=node,
        )

    def _read_block(self, latest: int, now: int) -> _AtBlock:
        """What the chain says at block ``latest`` (of time ``now``) whatever this node's
        records hold."""
        run = run_view(self.contracts, self.ledger.run_id, self.node)
        return (
            self.rewards.read(latest),
            tuple(self.slashes.read(latest)),
            tuple(v for v in [run] if v is not None),
            node_view(self.contracts, self.node, self.disputes.holds(), now),
        )

    def _certified_by(self, epoch: int) -> frozenset[str]:
        # Read after ``now``: every certificate submitted before the close is in a block up to
        # the latest one, so the set read is final.
        if epoch not in self.certified:
            certificates = self.ledger.certificates(epoch)
            self.certified[epoch] = frozenset(c.dataNode.lower() for c in certificates)
        return self.certified[epoch]

    def _book(self, epoch: int, now: int, paid_here: int) -> EpochBook:
        # Once an epoch settles its budget and certified units are fixed; what moves is what
        # was paid and whether it closed: read again when this node is paid in it, and, while
        # it is open, every OPEN_BOOK_READ_S (other workers' claims close it).
        kept = self.settled_books.get(epoch)
        if kept is not None and kept[0] == paid_here:
            _, book, read_at = kept
            if book.closed or now - read_at < OPEN_BOOK_READ_S:
                return book
        book = self.ledger.book(epoch)
        if now >= self.times[epoch].settles_at:
            self.settled_books[epoch] = (paid_here, book, now)
        return book


#: ``NodeRegistry.NodeStatus``, by its number.
NODE_STATUS = ("none", "active", "unbonding", "withdrawn", "slashed")


def node_view(
    contracts: Contracts,
    node: str,
    holds: Sequence[DisputeHold] | None = None,
    now: int | None = None,
) -> NodeView | None:
    """What the registry says of ``node`` and its wallet's balance, and the disputes that hold
    its stake (``holds``, read here when None) at chain time
    ``now``; None if not registered."""
    from libp2p.peer.id import ID
    from web3 import Web3

    info = contracts.port().node_info(node)
    if info is None:
        return None
    if holds is None:
        holds = stake_holds(contracts, info.node_address)
    if now is None:
        now = int(contracts.w3.eth.get_block("latest")["timestamp"])
    record = contracts.registry.functions.getNode(info.node_address).call()
    status = int(record[2])
    unlock_at = int(record[4]) and int(
        contracts.registry.functions.unlockAt(info.node_address).call()
    )
    return NodeView(
        node=info.node_address,
        wallet=info.operator,
        peer_id=ID(info.peer_id).to_base58() if info.peer_id else "",
        status=NODE_STATUS[status] if status < len(NODE_STATUS) else str(status),
        stake=Amount.of(info.stake_wei),
        unlock_at=unlock_at or None,
        capacity=CapacityView(
            gpu_model=info.gpu_model,
            memory_mib=info.memory_mib,
            microbatches_per_hour=info.throughput,
            max_in_flight=info.max_in_flight,
        ),
        wallet_balance=Amount.of(
            contracts.w3.eth.get_balance(Web3.to_checksum_address(info.operator))
        ),
        stake_holds=[stake_hold_view(hold, now) for hold in holds],
    )


def stake_hold_view(hold: DisputeHold, now: int) -> StakeHold:
    """A dispute's hold on the stake as the API shows it at chain time ``now``."""
    return StakeHold(
        dispute_id=hold.dispute_id,
        run_id=hold.run_id,
        epoch=hold.epoch,
        until=hold.until,
        releasable=hold.releasable(now),
        detail=hold.describe(now),
    )


def run_view(contracts: Contracts, run_id: int, node: str) -> RunView | None:
    run = contracts.port().run_info(run_id)
    if run is None:
        return None
    ledger = contracts.ledger.functions
    now = contracts.w3.eth.get_block("latest")["timestamp"]
    return RunView(
        **run_fields(run),
        member=bool(ledger.isAdmitted(run_id, node).call()),
        data_node=bool(ledger.wasDataNodeBefore(run_id, node, now + 1).call()),
    )


def run_fields(run: RunInfo) -> dict[str, Any]:
    """A run as the API and ``gwtf-node runs`` show it (amounts as wei and ETH)."""
    return {
        "run_id": run.run_id,
        "sponsor": run.sponsor,
        "stage_count": run.stage_count,
        "epoch_length_s": run.epoch_length_s,
        "challenge_window_s": run.challenge_window_s,
        "units_per_hop": run.units_per_hop,
        "reward_per_epoch": Amount.of(run.reward_per_epoch_wei),
        "hop_price": Amount.of(run.hop_price_wei),
        "pool": Amount.of(run.balance_wei),
        "min_stake": Amount.of(run.min_stake_wei),
        "open": not run.closed,
    }


def slashes_of(
    contracts: Contracts, run_id: int, from_block: int = 0, to_block: int | str = "latest"
) -> list[Slashed]:
    """The stakes taken for fraud in ``run_id`` in those blocks, from the ``FraudProven``
    events that took some: one per (run, epoch) a node is newly proven at fault in (a wrong
    tensor takes at most the run's minimum stake, other fraud all that is left), while a proof
    that takes nothing (it only competes for the bounty, or the stake is gone) is no slash."""
    logs = contracts.disputes.events.FraudProven.get_logs(
        argument_filters={"runId": run_id}, from_block=from_block, to_block=to_block
    )
    return [
        Slashed(
            node=a["node"],
            run_id=int(a["runId"]),
            epoch=int(a["epoch"]),
            fraud=Fraud(a["fraud"]).name.lower().replace("_", " "),
            slashed=Amount.of(int(a["slashedWei"])),
            tx_hash="0x" + bytes(log["transactionHash"]).hex(),
            block=int(log["blockNumber"]),
        )
        for log in logs
        for a in (log["args"],)
        if int(a["slashedWei"]) > 0
    ]


async def watch_chain(box: SnapshotBox, reader: ChainReader, period_s: float) -> None:
    """Keep ``box.chain`` current; a failed read keeps the last one and says so once. Whatever
    a reading raises, the node goes on: its API shows the last reading."""
    failing = False
    while True:
        try:
            box.chain = await trio.to_thread.run_sync(reader.read)
            failing = False
        except Exception as exc:  # the boundary: no reading may stop the node
            if not failing:
                log.warning(
                    "the chain's view of the run was not read (%s: %s); keeping the last",
                    type(exc).__name__, exc,
                )  # fmt: skip
            failing = True
        await trio.sleep(period_s)
