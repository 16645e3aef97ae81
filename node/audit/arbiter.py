"""The run sponsor's side of a tensor dispute: re-execute the disputed hop and rule on chain.

For each open dispute of the run, the arbiter reads the disputed receipt from the transaction
that opened it (the contract keeps only its digest), fetches the hop's evidence from the run's
nodes like an auditor (``node.audit.replays``), re-executes it, and rules: wrong when the replay
is outside the tolerance, right when it is within. The evidence hash it posts is keccak256 of
the canonical JSON of its record (the receipt digest, the weights' checked content digest and
whose they were, the errors measured), which it prints, so anyone can check the ruling by
re-running it while the relays still keep the evidence (the challenge window).
A dispute whose evidence nobody serves is left unruled with the reason: it lapses when the
epoch settles, in the worker's favour.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import trio
from web3.logs import DISCARD

from contracts.certificate_tree import SignedReceipt
from contracts.encoding import HopReceipt, ledger_domain, receipt_digest
from contracts.keccak import keccak256
from gwtf.errors import ChainError, ConfigError
from node.audit.reexecute import Replayer
from node.audit.replays import Replayed, evidence_source, replay_sample
from node.audit.runner import ask_chain, connect_peers
from node.chain.actions import Contracts, rule_tensor_dispute
from node.chain.adapter import Sender
from node.p2p.host import running_host
from node.p2p.identity import new_identity
from node.p2p.rpc import RequestResponse
from node.receipts.serving import CERTIFIED, fetch_receipts

DISPUTE_OPEN: Final = 1
WRONG: Final = "wrong tensor: worker slashed"
WRONG_BEFORE: Final = "wrong tensor: worker slashed before"
RIGHT: Final = "right tensor: bond to the worker"
UNRULED: Final = "unruled"


@dataclass(frozen=True)
class Ruling:
    dispute_id: int
    worker: str
    outcome: str  # WRONG, RIGHT or UNRULED
    detail: str
    record: dict[str, Any]
    tx_hash: str = ""
    slashed_wei: int = 0
    bounty_wei: int = 0

    def as_json(self) -> dict[str, Any]:
        """The ruling as ``arbitrate --json`` and the swarm's summary report it."""
        return {
            "dispute": self.dispute_id,
            "worker": self.worker,
            "outcome": self.outcome,
            "detail": self.detail,
            "record": self.record,
            "tx_hash": self.tx_hash,
            "slashed_wei": str(self.slashed_wei),
            "bounty_wei": str(self.bounty_wei),
        }


def open_disputes(contracts: Contracts, run_id: int) -> list[tuple[int, HopReceipt, bytes]]:
    """Each open tensor dispute of ``run_id``: (id, receipt, the worker's signature), from the
    event that opened it, in the order they were opened."""
    disputes = contracts.disputes
    logs = disputes.events.TensorDisputeOpened.get_logs(
        argument_filters={"runId": run_id}, from_block=0
    )
    found = []
    for log in logs:
        dispute_id = int(log["args"]["id"])
        if int(disputes.functions.tensorDisputes(dispute_id).call()[1]) != DISPUTE_OPEN:
            continue
        args = log["args"]
        receipt = HopReceipt(**dict(args["receipt"]))  # web3 decodes a struct as a dict
        found.append((dispute_id, receipt, bytes(args["workerSignature"])))
    return found


async def arbitrate(
    contracts: Contracts,
    arbiter: Sender,
    run_id: int,
    peers: Sequence[str],
    replayer: Replayer,
    timeout_s: float = 20.0,
) -> list[Ruling]:
    """Rule on every open tensor dispute of ``run_id`` with the evidence of the nodes at
    ``peers`` (multiaddrs)."""
    run = await ask_chain(contracts.port().run_info, run_id)
    if run is None:
        raise ConfigError(f"no run {run_id} on this chain; check --run and the RPC URL")
    if run.sponsor.lower() != arbiter.address.lower():
        raise ConfigError(
            f"run {run_id}'s disputes are ruled by its sponsor {run.sponsor}, not "
            f"{arbiter.address}; give the sponsor's wallet"
        )
    # Those of the earliest epoch first: they settle first.
    disputes = sorted(await ask_chain(open_disputes, contracts, run_id), key=lambda d: d[1].epoch)
    if not disputes:
        return []
    rulings = []
    async with running_host(new_identity()) as host:
        rpc = RequestResponse(host)
        reachable, _ = await connect_peers(host, peers, timeout_s)
        data_nodes = {receipt.dataNode.lower() for _, receipt, _ in disputes}
        source = evidence_source(rpc, peers, reachable, data_nodes, run_id, timeout_s)
        certificates: dict[tuple[int, str], list[SignedReceipt]] = {}
        for dispute_id, receipt, signature in disputes:
            key = (receipt.epoch, receipt.dataNode.lower())
            if key not in certificates:
                certificates[key] = await _certified(rpc, reachable, run_id, key, timeout_s)
            entry = _entry_of(certificates[key], receipt, signature)
            (replayed,) = await replay_sample(source, replayer, certificates[key], [(entry, None)])
            rulings.append(await _rule(contracts, arbiter, dispute_id, replayed, replayer))
    return rulings


async def _certified(
    rpc: RequestResponse,
    reachable: dict[str, str],
    run_id: int,
    key: tuple[int, str],
    timeout_s: float,
) -> list[SignedReceipt]:
    epoch, data_node = key
    peer = reachable.get(data_node)
    if peer is None:
        return []
    fetched = await fetch_receipts(rpc, peer, run_id, epoch, CERTIFIED, timeout_s)
    return fetched.entries


def _entry_of(
    certified: list[SignedReceipt], receipt: HopReceipt, signature: bytes
) -> SignedReceipt:
    for entry in certified:
        if entry.receipt == receipt:
            return entry
    return SignedReceipt(receipt, signature, b"")


async def _rule(
    contracts: Contracts, arbiter: Sender, dispute_id: int, replayed: Replayed, replayer: Replayer
) -> Ruling:
    receipt = replayed.entry.receipt
    replay = replayed.replay
    if replay is None:
        return Ruling(dispute_id, receipt.worker, UNRULED, replayed.why_not, {})
    domain = ledger_domain(contracts.w3.eth.chain_id, contracts.ledger.address)
    record = {
        "dispute": dispute_id,
        "receipt_digest": "0x" + receipt_digest(receipt, domain).hex(),
        "weights_digest": replay.state_digest,
        "weights_from": replayed.weights_from,
        "exact": replay.exact,
        "relative_error": replay.relative_error,
        "cosine": replay.cosine,
        "max_relative_error": replayer.tolerance.max_relative_error,
        "min_cosine": replayer.tolerance.min_cosine,
    }
    evidence_hash = keccak256(json.dumps(record, sort_keys=True).encode())
    try:
        mined = await trio.to_thread.run_sync(
            rule_tensor_dispute, contracts, arbiter, dispute_id, replay.wrong, evidence_hash
        )
    except ChainError as exc:  # e.g. the epoch settled meanwhile: the next disputes go on
        return Ruling(dispute_id, receipt.worker, UNRULED, str(exc)[:300], record)
    proven = contracts.disputes.events.FraudProven().process_receipt(mined, errors=DISCARD)
    slashed = sum(int(event["args"]["slashedWei"]) for event in proven)
    bounty = sum(int(event["args"]["bountyWei"]) for event in proven)
    outcome = RIGHT if not replay.wrong else (WRONG if slashed else WRONG_BEFORE)
    return Ruling(
        dispute_id, receipt.worker, outcome, replay.describe(), record,
        mined["transactionHash"].hex(), slashed, bounty,
    )  # fmt: skip
