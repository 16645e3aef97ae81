"""The swarm's audit, as anyone would run it: once every epoch is certified and before the
challenge windows close, ``gwtf-node audit``'s auditor (``node.audit.runner``, a libp2p host
of its own, served in public) checks each epoch's certificates and the receipts of every live
node, and ``gwtf-node challenge``'s prover (``node.audit.challenge``) sends the fraud proof of
each finding the chain judges alone, from an auditor wallet the sponsor funds. An honest swarm
has no finding; a cheating node (``[swarm] cheaters``) is found and slashed before anyone
claims.
"""

from __future__ import annotations

from typing import Any

import trio
from eth_account import Account

from node.audit.challenge import Challenges, challenge
from node.audit.checks import Finding
from node.audit.runner import AuditReport, audit_epoch
from node.chain.actions import transfer_eth
from node.chain.adapter import Sender
from node.swarm.chain import SwarmChain

AUDITOR_FUND_WEI = 10**18


def auditor_of(chain: SwarmChain) -> Sender:
    """A fresh wallet for the swarm's auditor, funded by the sponsor for its proofs' gas."""
    auditor = Sender.from_account(Account.create())
    transfer_eth(chain.contracts.w3, chain.sponsor, auditor.address, AUDITOR_FUND_WEI)
    return auditor


def audit_and_challenge(
    chain: SwarmChain, peers: list[str], last_epoch: int, auditor: Sender
) -> dict[str, Any]:
    """Audit epochs 0..``last_epoch`` with the receipts of the nodes at ``peers``, prove what
    the chain judges; what was checked, found and judged."""
    names = {node.node_address.lower(): name for name, node in chain.registered.items()}

    def named(address: str) -> str:
        return names.get(address.lower(), address)

    reports: list[AuditReport] = []
    proven: list[Challenges] = []
    for epoch in range(last_epoch + 1):
        report = trio.run(audit_epoch, chain.contracts, chain.run_id, epoch, peers)
        reports.append(report)
        proven.append(challenge(chain.contracts, auditor, report.findings))

    def finding(f: Finding) -> dict[str, Any]:
        return {
            "kind": f.kind,
            "accused": named(f.accused),
            "detail": f.detail,
            "provable_on_chain": f.proof is not None,
        }

    return {
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
            for done in proven
            for j in done.judgements
        ],
        "auditor": auditor.address,
        # What every proof took, and what of it was burned (the rest is the bounties).
        "slashed_wei": str(sum(j.slashed_wei for done in proven for j in done.judgements)),
        "burned_wei": str(chain.contracts.disputes.functions.burnedWei().call()),
        "bounty_withdrawn_wei": str(sum(done.withdrawn_wei for done in proven)),
    }
