"""The swarm's audit at its end: the auditor's checks (``node.audit.checks``) run on what the
swarm's nodes hold and the chain says. Every certificate on chain is checked leaf by leaf
against the tree its data node rebuilds from its database (roots, totals, sequence, each hop
by the disputes contract's validity rule, membership asked of the chain), and every receipt any
node holds, signed, countersigned or certified, is checked for equivocations. An honest swarm
has no finding; a finding names the node, and whether the chain would convict on its proof.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contracts.certificate_tree import SignedReceipt, build_certificate_tree
from contracts.encoding import ledger_domain
from node.audit.checks import Finding, RunRules, audit_certificate, equivocations
from node.chain.epochs import EpochLedger
from node.store.database import open_database
from node.store.hops import HopStore
from node.swarm.chain import SwarmChain


def audit_swarm(chain: SwarmChain, out_dir: Path, last_epoch: int) -> dict[str, Any]:
    """Certificates and leaves checked, receipts seen, and the findings (none when honest)."""
    contracts, run_id = chain.contracts, chain.run_id
    run = contracts.port().run_info(run_id)
    assert run is not None, "the swarm's run is on its chain"
    domain = ledger_domain(contracts.w3.eth.chain_id, contracts.ledger.address)
    rules = RunRules(run.stage_count, run.units_per_hop, domain)
    ledger = EpochLedger(contracts, run_id, None)
    names = {node.node_address.lower(): name for name, node in chain.registered.items()}
    findings: list[Finding] = []
    seen: list[SignedReceipt] = []
    certificates = leaves = 0
    for name, node in chain.registered.items():
        path = out_dir / f"{name}.sqlite"
        if not path.exists():
            continue
        db = open_database(f"sqlite:///{path}")
        try:
            store = HopStore(db)
            for epoch in range(last_epoch + 1):
                seen += store.signed_hops(run_id, epoch) + store.received_hops(run_id, epoch)
                cert = ledger.certificate(epoch, node.node_address)
                if cert is None:
                    continue
                entries = store.certified_hops(run_id, epoch)
                seen += entries
                tree = build_certificate_tree(entries, domain)
                served = [
                    (entry, tree.leaf_proof(i))
                    for i, entry in enumerate(tree.entries)
                    if entry is not None  # a tree rebuilt from receipts holds each one
                ]

                def took_part(node_address: str, or_data_node: bool, epoch: int = epoch) -> bool:
                    return ledger.took_part(node_address, epoch, or_data_node=or_data_node)

                findings += audit_certificate(cert, served, rules, took_part)
                certificates += 1
                leaves += len(served)
        finally:
            db.close()
    findings += equivocations(seen, domain)
    return {
        "certificates": certificates,
        "leaves_checked": leaves,
        "receipts_seen": len(seen),
        "findings": [
            {
                "kind": f.kind,
                "accused": names.get(f.accused.lower(), f.accused),
                "detail": f.detail,
                "provable_on_chain": f.proof is not None,
            }
            for f in findings
        ],
    }
