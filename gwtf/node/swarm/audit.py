"""The swarm's audit, as anyone would run it: once the last epoch is certified and its
submission closed, while every epoch's dispute window is open, ``gwtf-node audit``'s auditor
(``gwtf.node.audit.runner``, a libp2p host of its own, served in public) checks each epoch's
certificates and the receipts of every live node and re-executes a sample of each
certificate's hops (``[chain] audit_sample``) from the evidence the relays keep;
``gwtf-node challenge``'s prover (``gwtf.node.audit.challenge``) sends the fraud proof of each
finding the chain judges alone, and opens a tensor dispute for each wrong tensor, from an auditor
wallet the sponsor funds. The court's jury then rules on each dispute: seven juror wallets the
sponsor funds, each with a node of its own, pass over the cases as ``gwtf-node jury serve`` does
(``gwtf.node.audit.jury``), the auditor's pass reveals its draw salt, and the swarm mines the dev
chain's blocks up to each window. An honest swarm has no finding; a cheating node
(``[swarm] cheaters``) is found and slashed before anyone claims.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import trio
from eth_account import Account
from hexbytes import HexBytes
from web3.logs import DISCARD

from gwtf.node.audit.challenge import DISPUTED, SLASHED, Challenges, challenge, collect_bounties
from gwtf.node.audit.checks import Finding
from gwtf.node.audit.jury import next_due_block, open_cases, serve_once
from gwtf.node.audit.runner import AuditReport, Sampling, audit_epoch
from gwtf.node.chain.actions import Capacity, deposit_juror, register_node, transfer_eth
from gwtf.node.chain.adapter import Sender, mine_blocks
from gwtf.node.swarm.chain import SwarmChain

AUDITOR_FUND_WEI = 10**18
JURORS = 7
#: Each juror's court deposit, in penalties: enough for the seats of several cases at once.
JUROR_DEPOSIT_PENALTIES = 5
JUROR_CAPACITY = Capacity("cpu", 1024, 1, 1)
#: Rulings by Court ruling code: what the summary says of each.
RULINGS = {0: "no jury: bond returned", 1: "right tensor: bond to the worker", 2: "wrong tensor"}
WRONG_SLASHED = "wrong tensor: worker slashed"
WRONG_BEFORE = "wrong tensor: worker slashed before"
#: Passes over the open cases before the swarm gives up on a court that does not end them.
MAX_COURT_PASSES = 200


def auditor_of(chain: SwarmChain) -> Sender:
    """A fresh wallet for the swarm's auditor, funded by the sponsor for its proofs' gas."""
    auditor = Sender.from_account(Account.create())
    transfer_eth(chain.contracts.w3, chain.sponsor, auditor.address, AUDITOR_FUND_WEI)
    return auditor


def seat_jury(chain: SwarmChain, count: int = JURORS) -> list[tuple[Sender, bytes]]:
    """``count`` juror wallets, each funded by the sponsor, with a node of its own registered
    at the minimum stake and a court deposit of JUROR_DEPOSIT_PENALTIES penalties; each with
    its node's key, which it dials with (an accused answers its seated jurors outside the
    outsiders' rate)."""
    c = chain.contracts
    stake = int(c.registry.functions.minStakeWei().call())
    deposit = JUROR_DEPOSIT_PENALTIES * int(c.court.functions.penaltyWei().call())
    jurors = []
    for _ in range(count):
        wallet = Sender.from_account(Account.create())
        transfer_eth(c.w3, chain.sponsor, wallet.address, stake + deposit + AUDITOR_FUND_WEI)
        node = Account.create()
        register_node(c, wallet, bytes(node.key), JUROR_CAPACITY, stake)
        deposit_juror(c, wallet, node.address, deposit)
        jurors.append((wallet, bytes(node.key)))
    return jurors


class SwarmAudit:
    """The audit of each epoch of the swarm's run: ``epoch(e, peers)`` while its dispute
    window is open, ``summary()`` at the end."""

    def __init__(self, chain: SwarmChain, sampling: Sampling | None = None) -> None:
        self.chain = chain
        self.sampling = sampling
        self.auditor = auditor_of(chain)
        self.reports: list[AuditReport] = []
        self.proven: list[Challenges] = []
        self.rulings: list[dict[str, Any]] = []
        self.jurors = seat_jury(chain) if sampling is not None else []

    def epoch(self, epoch: int, peers: list[str]) -> None:
        """Audit ``epoch`` with the receipts and evidence of the nodes at ``peers``; prove what
        the chain judges, dispute what it cannot, and have the court's jury rule."""
        c = self.chain
        report = trio.run(
            functools.partial(
                audit_epoch, c.contracts, c.run_id, epoch, peers, sampling=self.sampling
            )
        )
        self.reports.append(report)
        done = challenge(c.contracts, self.auditor, report.findings)
        self.proven.append(done)
        if self.sampling is not None and any(j.outcome == DISPUTED for j in done.judgements):
            self._hold_court(peers)
        if any(j.outcome in (SLASHED, DISPUTED) for j in done.judgements):
            # A bounty is the earliest commitment's once no earlier one can still be revealed:
            # on the swarm's dev chain, blocks come only with transactions, so they are mined.
            window = int(c.contracts.disputes.functions.revealWindowBlocks().call())
            mine_blocks(c.contracts.w3, window + 1)
            done.withdrawn_wei += collect_bounties(c.contracts, self.auditor, report.findings)

    def _hold_court(self, peers: list[str]) -> None:
        """Every open case to its ruling: each participant's pass, then the dev chain mined to
        the next block at which a step opens."""
        assert self.sampling is not None
        c = self.chain.contracts
        replayer = self.sampling.replayer
        for _ in range(MAX_COURT_PASSES):
            cases = open_cases(c)
            if not cases:
                return
            for wallet, key in ((self.auditor, None), *self.jurors):
                passed = trio.run(
                    serve_once, c, wallet, peers, lambda _run: replayer, 20.0, None, key
                )
                for step in passed:
                    if step.action == "ruling executed":
                        self.rulings.append(self._ruling(step.case_id, step.tx_hash))
            due = [next_due_block(c, case.case_id) for case in open_cases(c)]
            upcoming = [block for block in due if block is not None]
            if upcoming:
                mine_blocks(c.w3, max(1, min(upcoming) - 1 - int(c.w3.eth.block_number)))
        raise RuntimeError(f"the court did not rule within {MAX_COURT_PASSES} passes")

    def _ruling(self, case_id: int, tx_hash: str) -> dict[str, Any]:
        c = self.chain.contracts
        mined = c.w3.eth.get_transaction_receipt(HexBytes(tx_hash))
        (ruled,) = c.disputes.events.TensorDisputeRuled().process_receipt(mined, errors=DISCARD)
        dispute = c.disputes.functions.tensorDisputes(ruled["args"]["id"]).call()
        proven = c.disputes.events.FraudProven().process_receipt(mined, errors=DISCARD)
        slashed = sum(int(event["args"]["slashedWei"]) for event in proven)
        bounty = sum(int(event["args"]["bountyWei"]) for event in proven)
        outcome = RULINGS[int(ruled["args"]["ruling"])]
        if int(ruled["args"]["ruling"]) == 2:
            outcome = WRONG_SLASHED if slashed else WRONG_BEFORE
        return {
            "case": case_id,
            "dispute": int(ruled["args"]["id"]),
            "worker": str(dispute[3]),
            "outcome": outcome,
            "tx_hash": tx_hash,
            "slashed_wei": str(slashed),
            "bounty_wei": str(bounty),
        }

    def slashed(self) -> set[str]:
        """The addresses of the nodes slashed on this audit's proofs (lower case)."""
        proven = {
            j.finding.accused.lower()
            for done in self.proven
            for j in done.judgements
            if j.outcome == SLASHED
        }
        return proven | {
            r["worker"].lower()
            for r in self.rulings
            if r["outcome"] in (WRONG_SLASHED, WRONG_BEFORE)
        }

    def summary(self) -> dict[str, Any]:
        """What was checked, found and judged, named by node."""
        names = {node.node_address.lower(): name for name, node in self.chain.registered.items()}

        def named(address: str) -> str:
            return names.get(address.lower(), address)

        def finding(f: Finding) -> dict[str, Any]:
            return {**f.as_json(), "accused": named(f.accused)}

        reports, judgements = self.reports, [j for done in self.proven for j in done.judgements]
        return {
            "epochs": [r.epoch for r in reports],
            "certificates": sum(len(r.certificates) for r in reports),
            "leaves_checked": sum(c.leaves_served for r in reports for c in r.certificates),
            "receipts_seen": sum(r.receipts_seen for r in reports),
            "peers_unread": {
                named(node): why for r in reports for node, why in r.peers.items() if why != "ok"
            },
            # Peers nobody could dial (at home), read through the node named.
            "peers_forwarded": {
                named(node): named(via) for r in reports for node, via in r.forwarded.items()
            },
            "findings": [finding(f) for r in reports for f in r.findings],
            "challenges": [
                {
                    **finding(j.finding),
                    "outcome": j.outcome,
                    "slashed_wei": str(j.slashed_wei),
                    "bounty_wei": str(j.bounty_wei),
                }
                for j in judgements
            ],
            "replayed": sum(len(c.replayed) for r in reports for c in r.certificates),
            "replayed_exact": sum(
                1
                for r in reports
                for c in r.certificates
                for done in c.replayed
                if done.replay is not None and done.replay.exact
            ),
            # Of those, the exact ones by the node that computed the hop.
            "replayed_exact_by_worker": dict(
                Counter(
                    named(done.entry.receipt.worker)
                    for r in reports
                    for c in r.certificates
                    for done in c.replayed
                    if done.replay is not None and done.replay.exact
                )
            ),
            "sample_notes": sorted({r.sample_note for r in reports if r.sample_note}),
            "rulings": [{**r, "worker": named(r["worker"])} for r in self.rulings],
            "auditor": self.auditor.address,
            # What every proof took, and what of it was burned (the rest is the bounties).
            "slashed_wei": str(
                sum(j.slashed_wei for j in judgements)
                + sum(int(r["slashed_wei"]) for r in self.rulings)
            ),
            "burned_wei": str(self.chain.contracts.disputes.functions.burnedWei().call()),
            "bounty_withdrawn_wei": str(sum(done.withdrawn_wei for done in self.proven)),
        }
