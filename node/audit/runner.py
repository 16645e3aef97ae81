"""An audit of one epoch of a run, as anyone can run it: the certificates from the chain, the
receipts and proofs from the nodes over ``/gwtf/receipts/1.0.0``, the checks of ``checks``.

The auditor is a libp2p host of its own (a fresh identity: nodes serve receipts to peers outside
the run, rate-limited) that dials the peers it is given. For each certificate submitted for the
epoch it fetches the data node's leaves with their proofs and checks them, membership asked of
the chain; it fetches every peer's signed and countersigned receipts too and looks for
equivocations across all it saw. A data node it cannot reach, or that will not serve, has its
certificate reported unchecked (which accuses nobody); what it read before a reading broke off
is checked all the same. A finding on a certificate already voided or settled is reported
without its proof: the chain would refuse it. Re-execution of hops is not part of it yet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import requests
import trio
from web3.exceptions import Web3Exception

from contracts.certificate_tree import SignedReceipt
from contracts.encoding import CertRef, ledger_domain
from gwtf.errors import ChainError, ConfigError, ProtocolError
from node.audit.checks import (
    UNCHECKED,
    Finding,
    RunRules,
    audit_certificate,
    equivocations,
)
from node.chain.actions import Contracts
from node.chain.epochs import EpochLedger
from node.p2p.host import peer_info, running_host
from node.p2p.identity import new_identity, node_address_of_peer
from node.p2p.rpc import RequestResponse
from node.receipts.serving import CERTIFIED, RECEIVED, SIGNED, fetch_receipts

T = TypeVar("T")


@dataclass
class CertificateReport:
    """One data node's certificate and what its audit found."""

    cert: CertRef
    leaves_served: int = 0
    findings: list[Finding] = field(default_factory=list)


@dataclass
class AuditReport:
    run_id: int
    epoch: int
    certificates: list[CertificateReport] = field(default_factory=list)
    receipts_seen: int = 0
    #: Peers dialled: node address -> "ok" or why not.
    peers: dict[str, str] = field(default_factory=dict)
    equivocations: list[Finding] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.certificates for f in c.findings] + self.equivocations

    @property
    def fraud(self) -> list[Finding]:
        """The findings the chain convicts on (each with its proof)."""
        return [f for f in self.findings if f.proof is not None]


def run_rules(contracts: Contracts, run_id: int) -> RunRules:
    run = contracts.port().run_info(run_id)
    if run is None:
        raise ConfigError(f"no run {run_id} on this chain; check --run and the RPC URL")
    domain = ledger_domain(contracts.w3.eth.chain_id, contracts.ledger.address)
    return RunRules(run.stage_count, run.units_per_hop, domain)


async def audit_epoch(
    contracts: Contracts,
    run_id: int,
    epoch: int,
    peers: Sequence[str],
    timeout_s: float = 20.0,
    progress: Callable[[str], None] = lambda step: None,
) -> AuditReport:
    """Audit ``epoch`` of ``run_id`` with the receipts of the nodes at ``peers`` (multiaddrs
    that end in /p2p/<peer id>)."""
    infos = [peer_info(address) for address in peers]  # a bad address fails before any dial
    rules = await _ask_chain(run_rules, contracts, run_id)
    ledger = EpochLedger(contracts, run_id, None)
    certs = await _ask_chain(ledger.certificates, epoch)
    report = AuditReport(run_id, epoch)

    def took_part(node: str, or_data_node: bool) -> bool:
        return ledger.took_part(node, epoch, or_data_node=or_data_node)

    async with running_host(new_identity()) as host:
        rpc = RequestResponse(host)
        reachable: dict[str, str] = {}  # node address -> peer id
        for info in infos:
            try:
                node = node_address_of_peer(info.peer_id)
            except ProtocolError as exc:
                raise ConfigError(f"peer {info.peer_id} is no GWTF node: {exc}") from exc
            try:
                with trio.fail_after(timeout_s):
                    await host.connect(info)
            except Exception as exc:  # libp2p's dial errors have no common type
                report.peers[node] = f"unreachable: {exc}"[:200]
                continue
            report.peers[node] = "ok"
            reachable[node.lower()] = str(info.peer_id)
        seen: list[SignedReceipt] = []
        for cert in certs:
            progress(f"certificate of {cert.dataNode}")
            checked = CertificateReport(cert)
            report.certificates.append(checked)
            peer = reachable.get(cert.dataNode.lower())
            if peer is None:
                detail = "its data node was not among the peers given, or did not answer"
                checked.findings.append(Finding(UNCHECKED, cert.dataNode, detail))
                continue
            fetched = await fetch_receipts(
                rpc, peer, run_id, epoch, CERTIFIED, timeout_s, limit=cert.count
            )
            served = [
                (entry, leaf)
                for page in fetched.pages
                for entry, leaf in zip(page.entries, page.leaves, strict=True)
            ]
            checked.leaves_served = len(served)
            seen += [entry for entry, _ in served]
            if fetched.stopped is not None:
                detail = f"read {len(served)} of {cert.count} leaves: {fetched.stopped}"
                checked.findings.append(Finding(UNCHECKED, cert.dataNode, detail[:300]))
            found = await _ask_chain(
                functools.partial(
                    audit_certificate, cert, served, rules, took_part,
                    complete=fetched.stopped is None,
                )
            )  # fmt: skip
            open_now = await _ask_chain(_open_to_challenge, contracts, cert)
            checked.findings += found if open_now else [_not_provable(f) for f in found]
        for node, peer in reachable.items():
            progress(f"receipts of {node}")
            for which in (SIGNED, RECEIVED):
                fetched = await fetch_receipts(rpc, peer, run_id, epoch, which, timeout_s)
                if fetched.stopped is not None:
                    report.peers[node] = f"served receipts only in part: {fetched.stopped}"[:200]
                seen += fetched.entries
    report.receipts_seen = len(seen)
    report.equivocations = await trio.to_thread.run_sync(equivocations, seen, rules.domain)
    return report


async def _ask_chain(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread: it asks the chain (blocking web3 calls), whose
    failures become one ``ChainError`` a person can act on."""
    try:
        return await trio.to_thread.run_sync(fn, *args)
    except (requests.RequestException, OSError, Web3Exception) as exc:
        raise ChainError(
            f"the chain did not answer the audit ({exc}); check --rpc-url, and that the "
            "provider serves eth_getLogs from block 0"
        ) from exc


def _open_to_challenge(contracts: Contracts, cert: CertRef) -> bool:
    """Whether a proof against ``cert`` can still convict: not voided, not settled."""
    ledger = contracts.ledger.functions
    stored = ledger.certificateCommitment(cert.runId, cert.epoch, cert.dataNode).call()
    settles_at = ledger.epochTimes(cert.runId, cert.epoch).call()[3]
    now = contracts.w3.eth.get_block("latest")["timestamp"]
    return bytes(stored) == cert.commitment() and now < settles_at


def _not_provable(finding: Finding) -> Finding:
    if finding.proof is None:
        return finding
    detail = f"{finding.detail} (no longer provable: the certificate is voided or settled)"
    return Finding(finding.kind, finding.accused, detail)
