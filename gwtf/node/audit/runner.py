"""An audit of one epoch of a run, as anyone can run it: the certificates from the chain, the
receipts and proofs from the nodes over ``/gwtf/receipts/3.0.0``, the checks of ``checks``.

The auditor is a libp2p host of its own (a fresh identity: nodes serve receipts to peers outside
the run, rate-limited) that dials the peers it is given. For each certificate submitted for the
epoch it fetches the data node's leaves with their proofs and checks them, membership asked of
the chain; it fetches every peer's signed and countersigned receipts too and looks for
equivocations across all it saw. A data node it cannot reach directly or through a node it
reached, or that will not serve, has its certificate reported unchecked (which accuses nobody);
what it read before a reading broke off is checked all the same. A page a data node read
directly sends malformed is its own: the leaves from there on count as withheld.
A finding the chain has judged already (a voided certificate, a signer
convicted in that epoch) is marked judged, and one on a settled epoch not provable: neither
carries its proof, which the chain would refuse. With a ``Sampling``, a sample of each
certificate's leaf indices drawn from a block hash after the submission deadline is
re-executed from the evidence the nodes keep (``gwtf.node.audit.replays``); sampled leaves a
reading lacks are read, runs of consecutive ones in one request (``LeafReader``): those the
data node answers directly without a valid leaf are withheld by it, those declined, timed out
or not asked in time unchecked; before that block exists nothing is sampled, and the report
says when.

A peer the auditor cannot dial (a relay at home, behind a NAT) is read through the nodes it did
reach, data nodes first: each forwards the request over the connection the relay keeps to it
(``/gwtf/receipts-via/3.0.0``, ``gwtf.node.p2p.forwarding``), so a home relay's receipts, and
any equivocation in them, are read as a public relay's are; ``AuditReport.forwarded`` says
through whom. A data node at home has its certificate read the same way, page by page through
the nodes reached, a reading cut short going on through the next from the first leaf it lacks,
keeping only pages whose every leaf verifies against the root on chain
(``read_certificate_over``), and is checked in full; ``CertificateReport.read_through`` says
through whom, and leaves read through a forwarder that do not verify are reported
``unverified``, accusing nobody (the data node may have served them so). Why forwarding, and
not the two other ways:

* not a circuit through a relay the home relay holds a slot at: a relay takes circuits only
  from peers the run admits (``relay_service``), and an auditor is anyone, with a fresh
  identity; opening circuits to anyone would hand strangers the relays' bandwidth. A forwarder
  passes on one bounded request at a time, over a connection kept up anyway, within the public
  rate.
* not the data node serving copies of the receipts it was pushed: those are what the relay
  chose to report, while an equivocation sits in what it signed or countersigned for others and
  keeps in its own store, which forwarding reads.

Receipts are signed, so a forwarder can withhold them (the peer is then reported unread, which
accuses nobody) but never forge one: an honest home relay is no more exposed than a public one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import requests
import trio
from web3.exceptions import Web3Exception

from gwtf.contracts.bindings import committed_spans
from gwtf.contracts.certificate_tree import LeafProof, SignedReceipt
from gwtf.contracts.encoding import CertRef, Eip712Domain, WorkerSpan, ledger_domain
from gwtf.errors import ChainError, ConfigError, ProtocolError
from gwtf.node.audit.checks import (
    UNCHECKED,
    UNVERIFIED,
    WITHHELD,
    Finding,
    RunRules,
    audit_certificate,
    equivocations,
    unverified_leaves,
    verifying_leaves,
    with_root_proofs,
)
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.audit.replays import (
    UNREPLAYED,
    WRONG_TENSOR,
    EvidenceSource,
    Progress,
    Replayed,
    draw_indices,
    draw_sample,
    evidence_source,
    fetch_receipts_over,
    forwarders_of,
    replay_findings,
    replay_sample,
    sample_seed,
    unreached_of,
    with_served_forwards,
)
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.p2p.dialing import PER_ADDRESS_S, Dialer, dialable
from gwtf.node.p2p.host import peer_info, running_host
from gwtf.node.p2p.identity import new_identity, node_address_of_peer
from gwtf.node.p2p.rpc import RequestResponse, RpcLimits
from gwtf.node.receipts.serving import (
    CERTIFIED,
    RECEIVED,
    SIGNED,
    Fetched,
    fetch_receipts,
)
from gwtf.node.receipts.wire import ReceiptPage

T = TypeVar("T")
log = logging.getLogger(__name__)

OPEN = "open"
VOIDED = "the certificate is voided"
SETTLED = "the epoch settled"
SLASHED = "the signer is convicted in this epoch"


@dataclass(frozen=True)
class Sampling:
    """Re-execute ``hops`` sampled hops of each certificate with ``replayer``."""

    hops: int
    replayer: Replayer


@dataclass
class CertificateReport:
    """One data node's certificate and what its audit found."""

    cert: CertRef
    leaves_served: int = 0
    #: The nodes its data node's pages were read through, in order, ", "-joined, when it was
    #: not dialled ("": read directly, or nothing read).
    read_through: str = ""
    findings: list[Finding] = field(default_factory=list)
    replayed: list[Replayed] = field(default_factory=list)


@dataclass
class AuditReport:
    run_id: int
    epoch: int
    certificates: list[CertificateReport] = field(default_factory=list)
    receipts_seen: int = 0
    #: Peers whose receipts were read: node address -> "ok" (directly or forwarded) or why not.
    peers: dict[str, str] = field(default_factory=dict)
    #: Peers not dialled but read through another node: node address -> that node's address.
    forwarded: dict[str, str] = field(default_factory=dict)
    equivocations: list[Finding] = field(default_factory=list)
    #: Why no hop was re-executed, when sampling was asked ("": it was, or it was not asked).
    sample_note: str = ""

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.certificates for f in c.findings] + self.equivocations

    @property
    def fraud(self) -> list[Finding]:
        """The findings the chain convicts on (each with its proof)."""
        return [f for f in self.findings if f.proof is not None]


#: Findings that accuse nobody: what the audit could not read or check (an unreachable or cut
#: short reading, leaves or evidence a forwarder passed on that do not verify, a hop it could
#: not re-execute). They prove nothing against anyone, only that the audit is incomplete.
ACCUSING_NOBODY = frozenset({UNCHECKED, UNVERIFIED, UNREPLAYED})


def accusing(findings: Sequence[Finding]) -> list[Finding]:
    """Those of ``findings`` that hold something against a node: fraud, withheld or unproven
    leaves, weights that differ (all but ``ACCUSING_NOBODY``)."""
    return [f for f in findings if f.kind not in ACCUSING_NOBODY]


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
    progress: Progress = lambda step: None,
    sampling: Sampling | None = None,
) -> AuditReport:
    """Audit ``epoch`` of ``run_id`` with the receipts of the nodes at ``peers`` (multiaddrs
    that end in /p2p/<peer id>); with ``sampling``, re-execute a sample of its hops."""
    for address in peers:
        peer_info(address)  # a bad address fails before anything is asked
    rules = await ask_chain(run_rules, contracts, run_id)
    ledger = EpochLedger(contracts, run_id, None)
    certs = await ask_chain(ledger.certificates, epoch)
    report = AuditReport(run_id, epoch)
    seed = None
    if sampling is not None and sampling.hops > 0:
        closes_at = (await ask_chain(ledger.epoch_times, epoch)).submit_closes_at
        seed = await ask_chain(sample_seed, contracts.w3, closes_at)
        if seed is None:
            report.sample_note = (
                f"no hop re-executed: the sample is drawn from the first block at or after "
                f"the submission deadline ({closes_at}, unix time); audit again after it"
            )

    def took_part(node: str, or_data_node: bool) -> bool:
        return ledger.took_part(node, epoch, or_data_node=or_data_node)

    async with running_host(new_identity()) as host:
        rpc = RequestResponse(host)
        reachable, report.peers = await connect_peers(host, peers, timeout_s)
        # One source for every certificate: what it learns of silent peers and the states it
        # fetched serve them all.
        data_nodes = {c.dataNode.lower() for c in certs}
        source = evidence_source(rpc, peers, reachable, data_nodes, run_id, timeout_s)
        # The nodes reached forward requests to those not (data nodes first; one not
        # connected to the target declines at once).
        forwarders = forwarders_of(reachable, data_nodes)
        key_of = {node.lower(): node for node in report.peers}  # as the report spells them
        node_of = {peer: key_of[node] for node, peer in reachable.items()}
        unreached = unreached_of(peers, reachable)
        seen: list[SignedReceipt] = []
        for cert in certs:
            progress(f"certificate of {cert.dataNode}")
            checked = CertificateReport(cert)
            report.certificates.append(checked)
            peer = reachable.get(cert.dataNode.lower())
            forwarded = malformed = False
            if peer is not None:
                fetched, malformed = await read_certificate_directly(rpc, cert, peer, timeout_s)
            elif (unreached_peer := unreached.get(cert.dataNode.lower())) is not None:
                forwarded = True
                fetched, through, forged = await read_certificate_over(
                    rpc, cert, unreached_peer, forwarders, rules.domain, timeout_s
                )
                checked.read_through = ", ".join(node_of[via] for via in through)
                for bad_via, indices in forged:
                    # The data node may have served them so: what is known is only that they
                    # came through this forwarder, which may well be honest.
                    detail = (
                        f"{len(indices)} leaves read through {node_of[bad_via]} (first: leaf "
                        f"{indices[0]}) do not verify against the data node's root and were "
                        f"set aside; the data node or {node_of[bad_via]} made them up, and "
                        f"{node_of[bad_via]} may be honest"
                    )
                    checked.findings.append(Finding(UNVERIFIED, "", detail))
            else:
                detail = "its data node was not among the peers given, or did not answer"
                checked.findings.append(Finding(UNCHECKED, cert.dataNode, detail))
                continue
            served = leaves_of(fetched)
            checked.leaves_served = len({leaf.hop.index for _, leaf in served})
            seen += [entry for entry, _ in served]
            found_reading, complete = reading_findings(
                cert, fetched, checked.leaves_served, checked.read_through, forwarded, malformed
            )
            checked.findings += found_reading
            # The spans committed are read from the ledger's event: a data node that served
            # others (or none) would escape the span check.
            spans = await ask_chain(committed_spans, contracts.ledger, cert)
            if spans is None:
                detail = "its spans not read: the provider has no CertificatesSubmitted log of it"
                checked.findings.append(Finding(UNCHECKED, cert.dataNode, detail))
            found = await ask_chain(
                functools.partial(
                    audit_certificate, cert, served, rules, took_part,
                    complete=complete, spans=spans,
                )
            )  # fmt: skip
            if seed is not None and sampling is not None:
                data_peer = peer if peer is not None else unreached[cert.dataNode.lower()]
                reader = LeafReader(rpc, data_peer, peer is not None, forwarders, timeout_s)
                checked.replayed, unread = await replay_certificate(
                    source, sampling, seed, cert, fetched, data_nodes, rules.domain, progress,
                    spans, reader,
                )  # fmt: skip
                found += unread + replay_findings(cert, checked.replayed)
            state = await ask_chain(_certificate_state, contracts, cert)
            slashed_workers = await ask_chain(
                _convicted_in, contracts, run_id, epoch,
                {f.accused for f in found if f.kind == WRONG_TENSOR},
            )  # fmt: skip
            checked.findings += [
                _as_of(SLASHED if f.accused in slashed_workers else state, f) for f in found
            ]
        # Every peer's own receipts: those dialled directly, the others through the nodes
        # reached.
        direct: list[str | None] = [None]
        routes = {node: (peer, direct) for node, peer in reachable.items()}
        routes |= {node: (peer, list(forwarders)) for node, peer in unreached.items()}
        for node, (peer, vias) in routes.items():
            progress(f"receipts of {node}")
            entries, via, why = await read_receipts(rpc, peer, vias, run_id, epoch, timeout_s)
            seen += entries
            key = key_of[node]
            if node in reachable:
                if why is not None:
                    report.peers[key] = f"served receipts only in part: {why}"[:200]
            elif via is not None:
                report.forwarded[key] = node_of[via]
                part = "" if why is None else f" (forwarded, in part: {why})"
                report.peers[key] = f"ok{part}"[:200]
            else:
                report.peers[key] = f"{report.peers[key]}; not forwarded: {why}"[:300]
    report.receipts_seen = len(seen)
    found = await trio.to_thread.run_sync(equivocations, seen, rules.domain)
    slashed = await ask_chain(_convicted_in, contracts, run_id, epoch, {f.accused for f in found})
    report.equivocations = [
        _as_of(SLASHED if f.accused in slashed else OPEN, f) for f in found
    ]  # fmt: skip
    return report


async def replay_certificate(
    source: EvidenceSource,
    sampling: Sampling,
    seed: bytes,
    cert: CertRef,
    fetched: Fetched,
    data_nodes: set[str],
    domain: Eip712Domain,
    progress: Progress = lambda step: None,
    spans: Sequence[WorkerSpan] | None = None,
    reader: LeafReader | None = None,
) -> tuple[list[Replayed], list[Finding]]:
    """Re-execute the sample ``seed`` draws of ``cert``'s relay hops, and what the sample
    found besides. The sample is of leaf indices, drawn over what the data node committed on
    chain (its leaf count and ``spans``: ``draw_indices``), so a reading it cuts short at a
    chosen page drops no relay from it: a sampled leaf the reading lacks is read on its own
    (``reader``), and one nobody serves is a finding (``LeafReader.findings``) while the rest
    of the sample is still re-executed. The sample, and a hop's replicas and forwards, come
    only from leaves that verify against the root on chain (``verified_leaves``): a direct
    reading may hold leaves that do not (reported ``unproven``), which could name a data
    node's sybils as replicas or yield a wrong tensor whose proof the chain refuses. Each
    sampled leaf carries a proof the chain accepts (``with_root_proofs``)."""
    served = leaves_of(fetched)
    verified = await trio.to_thread.run_sync(verifying_leaves, cert, served, domain)
    dropped = len(served) - len(verified)
    if dropped:
        log.warning(
            "%d leaves served of %s's certificate of epoch %d do not verify against its root "
            "on chain: not sampled", dropped, cert.dataNode, cert.epoch,
        )  # fmt: skip
    at = {leaf.hop.index: (entry, leaf) for entry, leaf in verified}
    indices = draw_indices(seed, cert.count, spans, sampling.hops, data_nodes)
    if spans is None:
        # No span names the workers: each one's first-ranked leaf of those read, then the
        # indices drawn, up to k in all.
        relay_hops = [p for p in verified if p[0].receipt.worker.lower() not in data_nodes]
        firsts = [leaf.hop.index for _, leaf in draw_sample(seed, relay_hops, 0)]
        drawn_too = [i for i in indices if i not in firsts]
        indices = firsts + drawn_too[: max(0, sampling.hops - len(firsts))]
    lacking = [i for i in indices if i not in at]
    found: list[Finding] = []
    read: list[tuple[SignedReceipt, LeafProof]] = []
    if lacking:
        reading = await (reader or LeafReader.none()).leaves(cert, lacking, domain)
        read = reading.read
        at |= {leaf.hop.index: (entry, leaf) for entry, leaf in read}
        found = (reader or LeafReader.none()).findings(cert, reading, len(indices))
    drawn = [at[i] for i in indices if i in at]
    # A hop a data node signed as its worker is no relay's work: an invalid hop already, with
    # nothing to re-execute.
    drawn = [p for p in drawn if p[0].receipt.worker.lower() not in data_nodes]
    sample = await trio.to_thread.run_sync(with_root_proofs, cert, served + read, drawn)
    entries = [entry for entry, _ in verified + read]
    entries = await with_served_forwards(source, entries, [e for e, _ in sample], domain)
    return await replay_sample(source, sampling.replayer, entries, sample, progress), found


#: What reading a certificate's sampled leaves may take, in request timeouts for each leaf
#: asked, and the rounds over its routes, with the wait
#: before the second (doubling before each later one): a data node too busy to answer at once is
#: asked again, one that stalls every request holds the audit for a bounded time.
LEAF_BUDGET_TIMEOUTS: Final = 6
LEAF_ROUNDS: Final = 3
FIRST_LEAF_RETRY_WAIT_S: Final = 1.0


@dataclass(frozen=True)
class LeafReading:
    """What reading sampled leaves gave: the leaves read (verified at their index), and of the
    indices not read, those the data node answered directly without a valid leaf, those asked
    but never answered so (declined, timed out, cut by the budget, or asked only through
    forwarders), and those the budget left unasked."""

    read: list[tuple[SignedReceipt, LeafProof]]
    withheld: list[int]
    unanswered: list[int]
    unasked: list[int]


@dataclass(frozen=True)
class LeafReader:
    """Reads sampled leaves of a certificate (with their proofs), each run of consecutive
    indices in one request: from its data node (``peer``), directly when it was dialled
    (``direct``), and through each of ``forwarders`` (the nodes reached that hold a connection
    to it)."""

    rpc: RequestResponse | None
    peer: str
    direct: bool
    forwarders: Sequence[str]
    timeout_s: float

    @staticmethod
    def none() -> LeafReader:
        """A reader with no route: every leaf asked is unread, accusing nobody."""
        return LeafReader(None, "", False, (), 0.0)

    async def leaves(
        self, cert: CertRef, indices: Sequence[int], domain: Eip712Domain
    ) -> LeafReading:
        """The leaves at ``indices`` that some route serves and that verify against the root
        at their index (each run of consecutive ones in one request at first, each leaf alone
        in later rounds), within the rounds and a budget of ``LEAF_BUDGET_TIMEOUTS`` request
        timeouts per index; and why each other index is not read."""
        others = [via for via in self.forwarders if via != self.peer]
        routes: list[str | None] = [*([None] if self.direct else []), *others]
        if self.rpc is None or not routes:
            return LeafReading([], [], [], list(indices))
        read: dict[int, tuple[SignedReceipt, LeafProof]] = {}
        withheld: set[int] = set()
        asked: set[int] = set()
        budget_s = LEAF_BUDGET_TIMEOUTS * self.timeout_s * len(indices)
        with trio.move_on_after(budget_s):
            for round_ in range(LEAF_ROUNDS):
                lacking_now = [i for i in indices if i not in read]
                # Later rounds ask each leaf alone: a data node that stalls any request
                # reaching into its colluder's span must stall that leaf's own request too.
                runs = _runs(lacking_now) if round_ == 0 else [(i, i) for i in lacking_now]
                if round_:
                    await trio.sleep(FIRST_LEAF_RETRY_WAIT_S * 2 ** (round_ - 1))
                for first, last in runs:
                    for via in routes:
                        lacking = [i for i in range(first, last + 1) if i not in read]
                        if not lacking:
                            break
                        asked.update(lacking)
                        found, answered = await self._run(cert, first, last, via, domain)
                        read |= found
                        if via is None:  # the data node's own answer, not a forwarder's
                            withheld |= {i for i in answered if i not in found}
                if len(read) == len(indices):
                    break
        rest = [i for i in indices if i not in read]
        return LeafReading(
            list(read.values()),
            [i for i in rest if i in withheld],
            [i for i in rest if i in asked and i not in withheld],
            [i for i in rest if i not in asked],
        )

    async def _run(
        self, cert: CertRef, first: int, last: int, via: str | None, domain: Eip712Domain
    ) -> tuple[dict[int, tuple[SignedReceipt, LeafProof]], set[int]]:
        """The leaves from ``first`` to ``last`` that ``via`` serves and that verify, and the
        indices its answer covered: those of the pages it sent, and all when the reading ended
        whole (the data node said there were no more) or on a page it sent malformed
        (``_AnswersSeen``), not when it broke off (declined, timed out)."""
        assert self.rpc is not None
        seen = _AnswersSeen(self.rpc)
        fetched = await fetch_receipts(
            cast(RequestResponse, seen), self.peer, cert.runId, cert.epoch, CERTIFIED,
            self.timeout_s, limit=last - first + 1, start=first, via=via,
        )  # fmt: skip
        wanted = range(first, last + 1)
        served = [(e, leaf) for e, leaf in leaves_of(fetched) if leaf.hop.index in wanted]
        verified = await trio.to_thread.run_sync(verifying_leaves, cert, served, domain)
        if fetched.stopped is None or seen.answered:
            answered = set(wanted)
        else:
            answered = {
                i
                for page in fetched.pages
                for i in range(page.offset, page.offset + len(page.entries))
                if i in wanted
            }
        return {leaf.hop.index: (e, leaf) for e, leaf in verified}, answered

    def findings(self, cert: CertRef, reading: LeafReading, sampled: int) -> list[Finding]:
        """What sampled leaves not read say: those the data node, dialled, answered directly
        without a valid leaf are its withholding; those declined, timed out or never asked
        (the budget ran out), or read only through forwarders (any of which can withhold),
        are unchecked, accusing nobody."""
        found = []
        if reading.withheld:
            what = f"{len(reading.withheld)} of {sampled} sampled leaves"
            detail = (
                f"{what} (first: leaf {reading.withheld[0]}) answered by the data node, asked "
                "directly, without a valid leaf, nor served through any node reached; the "
                "rest of the sample is re-executed"
            )
            found.append(Finding(WITHHELD, cert.dataNode, detail[:300]))
        if reading.unanswered or reading.unasked:
            kind = UNCHECKED if self.direct else UNVERIFIED
            how = "" if self.direct else " (the data node was not dialled, none forwarded)"
            detail = (
                f"{len(reading.unanswered)} of {sampled} sampled leaves asked and not answered "
                f"(declined or timed out), {len(reading.unasked)} not asked in time{how}"
            )
            found.append(Finding(kind, "", detail[:300]))
        return found


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """``indices`` as runs of consecutive ones: (first, last) each, in order."""
    runs: list[tuple[int, int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def reading_findings(
    cert: CertRef,
    fetched: Fetched,
    leaves_served: int,
    read_through: str,
    forwarded: bool,
    malformed: bool,
) -> tuple[list[Finding], bool]:
    """What a reading of ``cert`` that holds ``leaves_served`` of its leaves says of itself,
    and whether it counts as complete (the leaves it lacks then count against the data node):
    a page the data node sent malformed, read directly, is its own doing (the leaves from there
    on count as withheld); one read through a forwarder, or a reading cut short (unreachable,
    throttled, broken off), accuses nobody."""
    if forwarded and (fetched.stopped is not None or leaves_served < cert.count):
        # A forwarder can cut a reading short (a made-up total, an empty page, a malformed
        # page): what is missing accuses nobody, where read directly it is the data node's own.
        why = "" if fetched.stopped is None else f": {fetched.stopped}"
        detail = (
            f"{leaves_served} of {cert.count} leaves forwarded (through "
            f"{read_through or 'no forwarder'}); a forwarder can cut a reading short{why}"
        )
        return [Finding(UNVERIFIED, "", detail[:300])], False
    if fetched.stopped is None:
        return [], True
    if malformed:
        if leaves_served >= cert.count:
            return [], True  # every leaf read: what came after them decides nothing
        detail = (
            f"served a malformed page directly after {leaves_served} of {cert.count} leaves "
            f"({fetched.stopped}); the leaves from there on count as not served"
        )
        return [Finding(WITHHELD, cert.dataNode, detail[:300])], True
    detail = f"read {leaves_served} of {cert.count} leaves: {fetched.stopped}"
    return [Finding(UNCHECKED, cert.dataNode, detail[:300])], False


class _AnswersSeen:
    """``rpc`` as ``fetch_receipts`` asks it, remembering whether the last request was
    answered: a reading that stopped after its last page came stopped on that page's checks
    (it did not decode, started elsewhere, lacked leaves), so the peer sent it malformed; one
    whose last request was not answered broke off (unreachable, timed out, declined)."""

    def __init__(self, rpc: RequestResponse) -> None:
        self.rpc, self.answered = rpc, False

    async def request(self, peer: Any, protocol: str, payload: bytes, limits: RpcLimits) -> bytes:
        self.answered = False
        reply = await self.rpc.request(peer, protocol, payload, limits)
        self.answered = True
        return reply


async def read_certificate_directly(
    rpc: RequestResponse, cert: CertRef, peer: str, timeout_s: float
) -> tuple[Fetched, bool]:
    """``cert``'s pages from its data node (``peer``, dialled), and whether the reading
    stopped on a page the data node sent malformed (``_AnswersSeen``)."""
    seen = _AnswersSeen(rpc)
    fetched = await fetch_receipts(
        cast(RequestResponse, seen),  # asked only for ``request``
        peer, cert.runId, cert.epoch, CERTIFIED, timeout_s, limit=cert.count,
    )  # fmt: skip
    return fetched, fetched.stopped is not None and seen.answered


async def read_certificate_over(
    rpc: RequestResponse,
    cert: CertRef,
    peer: str,
    forwarders: Sequence[str],
    domain: Eip712Domain,
    timeout_s: float,
) -> tuple[Fetched, list[str], list[tuple[str, list[int]]]]:
    """The pages of ``cert`` that its data node (``peer``, not dialled) serves through
    ``forwarders``, each asked in turn from where the reading before it stopped, until the
    reading holds every one of ``cert.count`` leaves: (the reading, the forwarders whose pages
    it holds, in order, each forwarder whose pages did not verify with the indices of the
    leaves that did not). A forwarder can withhold, never forge: only pages whose every leaf
    verifies against the root (``unverified_leaves``), each at its place, are kept, and a
    reading cut short (an error, an empty page, a made-up total, a page that does not verify)
    goes on through the next forwarder from the first leaf it lacks. ``stopped`` says why the
    last forwarder asked stopped short, None when it ended cleanly or the reading is whole."""
    pages: list[ReceiptPage] = []
    through: list[str] = []
    forged: list[tuple[str, list[int]]] = []
    offset = 0
    stopped: str | None = "no node reached to read it through"
    for via in forwarders:
        if offset >= cert.count:
            break
        fetched = await fetch_receipts(
            rpc, peer, cert.runId, cert.epoch, CERTIFIED, timeout_s,
            limit=cert.count - offset, start=offset, via=via,
        )  # fmt: skip
        kept, bad = await trio.to_thread.run_sync(_verified_pages, cert, fetched.pages, domain)
        if kept:
            pages += kept
            through.append(via)
            offset = kept[-1].offset + len(kept[-1].entries)
        if bad:
            forged.append((via, bad))
        stopped = f"the pages read through {via} do not verify" if bad else fetched.stopped
    return Fetched(tuple(pages), None if offset >= cert.count else stopped), through, forged


def _verified_pages(
    cert: CertRef, pages: Sequence[ReceiptPage], domain: Eip712Domain
) -> tuple[list[ReceiptPage], list[int]]:
    """The leading ``pages`` whose every leaf verifies (``unverified_leaves``) and sits at its
    index, and the indices of the leaves of the first page that does not (none: all do)."""
    for n, page in enumerate(pages):
        served = list(zip(page.entries, page.leaves, strict=True))
        misplaced = [
            leaf.hop.index
            for i, (_, leaf) in enumerate(served)
            if leaf.hop.index != page.offset + i
        ]
        bad = sorted(set(unverified_leaves(cert, served, domain) + misplaced))
        if bad:
            return [p for p in pages[:n] if p.entries], bad
    return [p for p in pages if p.entries], []


def verified_leaves(
    cert: CertRef, fetched: Fetched, domain: Eip712Domain
) -> list[tuple[SignedReceipt, LeafProof]]:
    """The leaves of ``fetched`` that verify against ``cert``'s root on chain, each with the
    receipt it commits (``unverified_leaves``): the only leaves that may name a hop's replicas,
    whose weights can judge it, since a data node could otherwise name its own sybils."""
    return verifying_leaves(cert, leaves_of(fetched), domain)


def leaves_of(fetched: Fetched) -> list[tuple[SignedReceipt, LeafProof]]:
    """Each receipt of a certificate's pages with its leaf."""
    return [
        (entry, leaf)
        for page in fetched.pages
        for entry, leaf in zip(page.entries, page.leaves, strict=True)
    ]


async def read_receipts(
    rpc: RequestResponse,
    peer: str,
    routes: Sequence[str | None],
    run_id: int,
    epoch: int,
    timeout_s: float,
) -> tuple[list[SignedReceipt], str | None, str | None]:
    """``peer``'s signed and countersigned receipts of ``epoch``, each kind over the first of
    ``routes`` that serves it (``fetch_receipts_over``): (the receipts, the forwarder that
    served them, None when read directly or not at all, why a reading stopped short or None)."""
    entries: list[SignedReceipt] = []
    served_by, why = None, None
    for which in (SIGNED, RECEIVED):
        fetched, via = await fetch_receipts_over(rpc, peer, routes, run_id, epoch, which, timeout_s)
        entries += fetched.entries
        if fetched.pages:
            served_by = served_by or via
        why = why or fetched.stopped
    return entries, served_by, why


async def connect_peers(
    host: Any, peers: Sequence[str], timeout_s: float
) -> tuple[dict[str, str], dict[str, str]]:
    """Dial each of ``peers`` (multiaddrs) within ``timeout_s``, shared by its addresses: (node
    address in lower case -> peer id of those reached, node address -> "ok" or why not). A node
    busy training may take seconds over a connection's handshakes: the auditor, which dials each
    peer once, gives each address its share of ``timeout_s``, never less than the
    ``PER_ADDRESS_S`` nodes give their neighbours' addresses."""
    infos = [peer_info(address) for address in peers]
    reachable: dict[str, str] = {}
    statuses: dict[str, str] = {}
    for info in infos:
        try:
            node = node_address_of_peer(info.peer_id)
        except ProtocolError as exc:
            raise ConfigError(f"peer {info.peer_id} is no GWTF node: {exc}") from exc
        per_address_s = max(PER_ADDRESS_S, timeout_s / max(1, len(dialable(info.addrs))))
        dialer = Dialer(host, per_address_s=per_address_s)
        try:
            with trio.fail_after(timeout_s):
                await dialer.connect(info.peer_id, info.addrs)
        except Exception as exc:  # libp2p's dial errors have no common type
            statuses[node] = f"unreachable: {exc}"[:200]
            continue
        statuses[node] = "ok"
        reachable[node.lower()] = str(info.peer_id)
    return reachable, statuses


async def ask_chain(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread: it asks the chain (blocking web3 calls), whose
    failures become one ``ChainError`` a person can act on."""
    try:
        return await trio.to_thread.run_sync(fn, *args)
    except (requests.RequestException, OSError, Web3Exception) as exc:
        raise ChainError(
            f"the chain did not answer the audit ({exc}); check --rpc-url, and that the "
            "provider serves eth_getLogs from block 0"
        ) from exc


def _certificate_state(contracts: Contracts, cert: CertRef) -> str:
    """Whether a proof against ``cert`` can still convict (OPEN), or why not."""
    ledger = contracts.ledger.functions
    stored = ledger.certificateCommitment(cert.runId, cert.epoch, cert.dataNode).call()
    if bytes(stored) != cert.commitment():
        return VOIDED
    settles_at = ledger.epochTimes(cert.runId, cert.epoch).call()[3]
    now = contracts.w3.eth.get_block("latest")["timestamp"]
    return OPEN if now < settles_at else SETTLED


def _convicted_in(contracts: Contracts, run_id: int, epoch: int, nodes: set[str]) -> set[str]:
    """The ``nodes`` convicted in (run, epoch) already: a further proof of theirs there changes
    nothing, while one of another epoch still burns their pay there."""
    ledger = contracts.ledger.functions
    return {n for n in nodes if ledger.isConvictedIn(run_id, epoch, n).call()}


def _as_of(state: str, finding: Finding) -> Finding:
    """``finding`` as the chain stands (``state``): judged already, or no longer provable."""
    if finding.proof is None or state == OPEN:
        return finding
    judged = state in (VOIDED, SLASHED)
    why = "judged: " if judged else "no longer provable: "
    return Finding(finding.kind, finding.accused, f"{finding.detail} ({why}{state})", None, judged)
