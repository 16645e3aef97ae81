"""The swarm's audit, as anyone would run it: once the last epoch is certified and its
submission closed, while every epoch's dispute window is open, ``gwtf-node audit``'s auditor
(``node.audit.runner``, a libp2p host of its own, served in public) checks each epoch's
certificates and the receipts of every live node and re-executes a sample of each
certificate's hops (``[chain] audit_sample``) from the evidence the relays keep;
``gwtf-node challenge``'s prover (``node.audit.challenge``) sends the fraud proof of each finding
the chain judges alone, and opens a tensor dispute for each wrong tensor, from an auditor wallet
the sponsor funds; the sponsor then rules on the disputes (``node.audit.arbiter``). An honest
swarm has no finding; a cheating node (``[swarm] cheaters``) is found and slashed before anyone
claims.
"""

from __future__ import annotations

import functools
from typing import Any

import trio
from eth_account import Account

from node.audit.arbiter import WRONG, WRONG_BEFORE, Ruling, arbitrate
from node.audit.challenge import DISPUTED, SLASHED, Challenges, challenge, collect_bounties
from node.audit.checks import Finding
from node.audit.runner import AuditReport, Sampling, audit_epoch
from node.chain.actions import transfer_eth
from node.chain.adapter import Sender, mine_blocks
from node.swarm.chain import SwarmChain

AUDITOR_FUND_WEI = 10**18


def auditor_of(chain: SwarmChain) -> Sender:
    """A fresh wallet for the swarm's auditor, funded by the sponsor for its proofs' gas."""
    auditor = Sender.from_account(Account.create())
    transfer_eth(chain.contracts.w3, chain.sponsor, auditor.address, AUDITOR_FUND_WEI)
    return auditor


class SwarmAudit:
    """The audit of each epoch of the swarm's run: ``epoch(e, peers)`` while its dispute
    window is open, ``summary()`` at the end."""

    def __init__(self, chain: SwarmChain, sampling: Sampling | None = None) -> None:
        self.chain = chain
        self.sampling = sampling
        self.auditor = auditor_of(chain)
        self.reports: list[AuditReport] = []
        self.proven: list[Challenges] = []
        self.rulings: list[Ruling] = []

    def epoch(self, epoch: int, peers: list[str]) -> None:
        """Audit ``epoch`` with the receipts and evidence of the nodes at ``peers``; prove what
        the chain judges, dispute what it cannot, and have the sponsor rule."""
        c = self.chain
        report = trio.run(
            functools.partial(
                audit_epoch, c.contracts, c.run_id, epoch, peers, sampling=self.sampling
            )
        )
        self.reports.append(report)
        done = challenge(c.contracts, self.auditor, report.findings)
        self.proven.append(done)
        if self.sampling is not None:
            replayer = self.sampling.replayer
            self.rulings += trio.run(arbitrate, c.contracts, c.sponsor, c.run_id, peers, replayer)
        if any(j.outcome in (SLASHED, DISPUTED) for j in done.judgements):
            # A bounty is the earliest commitment's once no earlier one can still be revealed:
            # on the swarm's dev chain, blocks come only with transactions, so they are mined.
            window = int(c.contracts.disputes.functions.revealWindowBlocks().call())
            mine_blocks(c.contracts.w3, window + 1)
            done.withdrawn_wei += collect_bounties(c.contracts, self.auditor, report.findings)

    def slashed(self) -> set[str]:
        """The addresses of the nodes slashed on this audit's proofs (lower case)."""
        proven = {
            j.finding.accused.lower()
            for done in self.proven
            for j in done.judgements
            if j.outcome == SLASHED
        }
        return proven | {
            r.worker.lower() for r in self.rulings if r.outcome in (WRONG, WRONG_BEFORE)
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
            "sample_notes": sorted({r.sample_note for r in reports if r.sample_note}),
            "rulings": [{**r.as_json(), "worker": named(r.worker)} for r in self.rulings],
            "auditor": self.auditor.address,
            # What every proof took, and what of it was burned (the rest is the bounties).
            "slashed_wei": str(
                sum(j.slashed_wei for j in judgements) + sum(r.slashed_wei for r in self.rulings)
            ),
            "burned_wei": str(self.chain.contracts.disputes.functions.burnedWei().call()),
            "bounty_withdrawn_wei": str(sum(done.withdrawn_wei for done in self.proven)),
        }
