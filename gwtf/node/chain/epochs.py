"""The ledger as a node's epoch cycle sees it: chain time, epoch windows, certificates, claims.

Blocking web3 calls (the cycle runs them in worker threads). Every answer comes from the chain
itself — views and events — so a node that crashed between sending a transaction and recording
it learns from here what happened, and never sends it twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from web3.logs import DISCARD

from gwtf.contracts.certificate_tree import WorkerRange
from gwtf.contracts.encoding import CertRef, WorkerSpan
from gwtf.node.chain.actions import Contracts, submit_certificates
from gwtf.node.chain.adapter import Sender


class EpochNow(Protocol):
    """The run's epoch now, by chain time (``receipts.epochs.EpochClock.epoch_now``: the
    chain's time as last read, run on by the local clock since). Does not wait on the chain or
    raise."""

    def __call__(self) -> int: ...


class ChainTime(Protocol):
    """The timestamp (s) of the latest block the node has seen: never a time run on by the
    local clock, so what it says has passed, a block says. Does not wait on the chain."""

    def __call__(self) -> int: ...


@dataclass(frozen=True)
class EpochTimes:
    starts_at: int
    ends_at: int
    submit_closes_at: int
    settles_at: int


@dataclass(frozen=True)
class EpochBook:
    """``WorkLedger.epochBook``: what the epoch's certificates reserved at the run's price,
    their units and what was paid."""

    budget_wei: int
    total_units: int
    certified: bool
    paid_units: int
    paid_wei: int
    closed: bool


@dataclass(frozen=True)
class RewardPaid:
    """One ``RewardClaimed`` event: a range of one data node's certificate, paid."""

    epoch: int
    data_node: str
    units: int
    amount_wei: int
    tx_hash: bytes
    block: int = 0
    log_index: int = 0


@dataclass(frozen=True)
class Paid:
    """A mined claim: its transaction and the wei it paid."""

    tx_hash: bytes
    amount_wei: int
    units: int


class EpochLedger:
    """The views and transactions of one run's epochs, sent from ``wallet`` (None: read only)."""

    def __init__(self, contracts: Contracts, run_id: int, wallet: Sender | None) -> None:
        self.c = contracts
        self.run_id = run_id
        self.wallet = wallet
        self._times: dict[int, EpochTimes] = {}  # a run's epoch windows never change

    def now(self) -> int:
        """Chain time: the latest block's timestamp."""
        return int(self.c.w3.eth.get_block("latest")["timestamp"])

    def epoch_times(self, epoch: int) -> EpochTimes:
        if epoch not in self._times:
            times = self.c.ledger.functions.epochTimes(self.run_id, epoch).call()
            self._times[epoch] = EpochTimes(*times)
        return self._times[epoch]

    def run_start_and_length(self) -> tuple[int, int]:
        run = self.c.ledger.functions.getRun(self.run_id).call()
        return int(run[1]), int(run[2])  # Run struct: sponsor, startTime, epochLengthS, ...

    def took_part(self, node: str, epoch: int, *, or_data_node: bool = False) -> bool:
        """Whether ``node`` was bonded and a member of the run (or, with ``or_data_node``, one
        of its data nodes) during ``epoch``: what the disputes contract checks of a hop's
        worker and counterparty."""
        times = self.epoch_times(epoch)
        ledger, registry = self.c.ledger.functions, self.c.registry.functions
        member = ledger.wasMemberDuring(self.run_id, node, times.starts_at, times.ends_at).call()
        if not member and or_data_node:
            member = ledger.wasDataNodeBefore(self.run_id, node, times.ends_at).call()
        return bool(member) and bool(
            registry.bondedDuring(node, times.starts_at, times.ends_at).call()
        )

    def certificate(self, epoch: int, data_node: str) -> CertRef | None:
        """The certificate ``data_node`` submitted for ``epoch``, from its event."""
        logs = self.c.ledger.events.CertificatesSubmitted.get_logs(
            argument_filters={"runId": self.run_id, "epoch": epoch, "dataNode": data_node},
            from_block=0,
        )
        if not logs:
            return None
        return self._cert_of(epoch, logs[-1]["args"])

    def certificates(self, epoch: int) -> list[CertRef]:
        """Every data node's certificate of ``epoch``, from the events (the last of each)."""
        logs = self.c.ledger.events.CertificatesSubmitted.get_logs(
            argument_filters={"runId": self.run_id, "epoch": epoch}, from_block=0
        )
        latest = {log["args"]["dataNode"]: log["args"] for log in logs}
        return [self._cert_of(epoch, a) for a in latest.values()]

    def _cert_of(self, epoch: int, args: Any) -> CertRef:
        """The certificate a CertificatesSubmitted event's arguments name."""
        return CertRef(
            self.run_id, epoch, args["dataNode"], bytes(args["root"]), args["count"],
            args["units"], bytes(args["rangesRoot"]),
        )  # fmt: skip

    def book(self, epoch: int) -> EpochBook:
        return EpochBook(*self.c.ledger.functions.epochBook(self.run_id, epoch).call())

    def rewards_to(
        self, node: str, from_block: int = 0, to_block: int | str = "latest"
    ) -> list[RewardPaid]:
        """The rewards ``node`` was paid in this run in those blocks, from the events."""
        logs = self.c.ledger.events.RewardClaimed.get_logs(
            argument_filters={"runId": self.run_id, "node": node},
            from_block=from_block,
            to_block=to_block,
        )
        return [
            RewardPaid(
                int(a["epoch"]), a["dataNode"], int(a["units"]), int(a["amountWei"]),
                bytes(log["transactionHash"]), int(log["blockNumber"]), int(log["logIndex"]),
            )
            for log in logs
            for a in (log["args"],)
        ]  # fmt: skip

    def submit(self, cert: CertRef, spans: Sequence[WorkerSpan]) -> bytes:
        assert self.wallet is not None, "a read-only ledger sends nothing"
        return bytes(submit_certificates(self.c, self.wallet, cert, spans)["transactionHash"])

    def paid(self, epoch: int, data_node: str, node: str) -> Paid | None:
        """The claim of ``node``'s range of ``data_node``'s certificate, if one was mined."""
        logs = self.c.ledger.events.RewardClaimed.get_logs(
            argument_filters={"runId": self.run_id, "epoch": epoch, "node": node}, from_block=0
        )
        for log in logs:
            if log["args"]["dataNode"] == data_node:
                return _paid(log)
        return None

    def claim(self, cert: CertRef, span: WorkerRange) -> Paid:
        assert self.wallet is not None, "a read-only ledger sends nothing"
        receipt = self.c.send(
            self.wallet, self.c.ledger.functions.claimReward(*span.claim_args(cert))
        )
        # The receipt's other logs (an EpochClosed by the last claim) are not this event's.
        events = self.c.ledger.events.RewardClaimed().process_receipt(receipt, errors=DISCARD)
        return _paid(events[0])


def _paid(log: Any) -> Paid:
    return Paid(bytes(log["transactionHash"]), int(log["args"]["amountWei"]), log["args"]["units"])
