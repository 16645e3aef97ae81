"""What the chain says of this node's run, read every few seconds for the API and the CLI.

``read_chain`` (blocking web3, run in a worker thread) reads the chain's time, the windows and
books of every epoch the node worked or claimed in, the rewards paid to it, its run and the
run's slashes. The node's loop keeps the latest in its ``SnapshotBox``; ``gwtf-node earnings``
calls it once.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from api.schemas import Amount, RunView, Slashed
from contracts.fraud_proofs import Fraud
from gwtf.errors import ChainError
from node.chain.actions import Contracts
from node.chain.adapter import RunInfo
from node.chain.epochs import EpochLedger
from node.local_api.earnings import ChainView, ClaimRecord, earnings_of
from node.local_api.snapshot import ChainParts, SnapshotBox
from node.store.views import NodeRecords

log = logging.getLogger(__name__)


def claim_records(records: NodeRecords, run_id: int) -> list[ClaimRecord]:
    return [
        ClaimRecord(
            c.epoch, c.data_node, c.units, c.status, int(c.amount_wei or 0), c.tx_hash, c.error
        )
        for c in records.claims(run_id)
    ]


def read_chain(
    contracts: Contracts, ledger: EpochLedger, records: NodeRecords, node: str
) -> ChainParts:
    run_id = ledger.run_id
    work = records.work(run_id)
    claims = claim_records(records, run_id)
    paid = ledger.rewards_to(node)
    epochs = sorted(set(work.units) | {c.epoch for c in claims} | {p.epoch for p in paid})
    view = ChainView(
        now=ledger.now(),
        times={e: ledger.epoch_times(e) for e in epochs},
        books={e: ledger.book(e) for e in epochs},
        paid=paid,
    )
    earned = earnings_of(run_id, work.units, work.data_nodes, claims, view)
    runs = tuple(v for v in [run_view(contracts, run_id, node)] if v is not None)
    return ChainParts(
        view=view,
        runs=runs,
        slashes=tuple(slashes_of(contracts, run_id)),
        claimed_wei=sum(int(e.claimed.wei) for e in earned),
        claimable_wei=sum(int(e.claimable.wei) for e in earned),
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
        "pool": Amount.of(run.balance_wei),
        "min_stake": Amount.of(run.min_stake_wei),
        "open": not run.closed,
    }


def slashes_of(contracts: Contracts, run_id: int) -> list[Slashed]:
    """Every node slashed for fraud in ``run_id``, from the ``FraudProven`` events."""
    logs = contracts.disputes.events.FraudProven.get_logs(
        argument_filters={"runId": run_id}, from_block=0
    )
    return [
        Slashed(
            node=a["node"],
            run_id=int(a["runId"]),
            epoch=int(a["epoch"]),
            fraud=Fraud(a["fraud"]).name.lower().replace("_", " "),
            slashed=Amount.of(int(a["slashedWei"])),
            tx_hash="0x" + bytes(log["transactionHash"]).hex(),
        )
        for log in logs
        for a in (log["args"],)
    ]


async def watch_chain(
    box: SnapshotBox,
    contracts: Contracts,
    ledger: EpochLedger,
    records: NodeRecords,
    node: str,
    period_s: float,
) -> None:
    """Keep ``box.chain`` current; a failed read keeps the last one and says so once."""
    failing = False
    while True:
        try:
            box.chain = await trio.to_thread.run_sync(read_chain, contracts, ledger, records, node)
            failing = False
        except (ChainError, OSError) as exc:
            if not failing:
                log.warning("the chain's view of the run was not read (%s); keeping the last", exc)
            failing = True
        await trio.sleep(period_s)
