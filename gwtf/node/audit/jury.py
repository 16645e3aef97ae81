"""A volunteer's side of the court (``gwtf-node jury serve``): one pass over every open case.

Each pass does what the wallet's roles and the case's phase call for, every step in its
window (``gwtf/contracts/Court.sol``):

* accused (a case against a node of this wallet): answer with a fresh salt, so the challenger
  cannot pick its jury by its own salt;
* challenger (a dispute this wallet opened): reveal the draw salt it committed
  (``gwtf.node.chain.actions.draw_salt_of``) once the accused answered or could no longer;
* juror (seats of the wallet's juror node in the current round): fetch the disputed hop's
  evidence from the run's nodes like an auditor (``gwtf.node.audit.replays``), dialling with
  the juror node's key, so the accused and its forwarders answer it outside the rate all
  outsiders share (they read its seat from the court), re-execute it
  (``gwtf.node.audit.reexecute``) and commit a sealed vote: WRONG when the replay is outside the
  run's tolerance or the accused's evidence is missing, RIGHT when it is within; then reveal
  it. A juror that reached no peer at all does not vote (it is fined as absent rather than
  convicting anyone blind). Evidence tries stop within the commit window (at ``RETRY_SHARE``
  of the blocks it has left, read from the chain while it fetches, the whole evidence phase
  at ``VERDICT_SHARE``): evidence is
  missing only when the accused had its whole retry schedule (busy declines are asked again;
  still busy at its end is missing, or "busy" would be every cheater's answer); one this
  juror's window cut short is not shown wrong in time (RIGHT);
* what counts as the accused's evidence: everything a re-execution needs is something the
  accused worker keeps and serves itself (the hop's input and output frames, its stage
  weights at the iteration, and for a backward the receipt of its forward, which it signed,
  and that forward's input frame). Others are asked too (neighbours keep the same frames, the
  data node certifies the forward's receipt, the counterparty countersigned it), but nothing
  depends on them: a forward's receipt counts only when the accused signed it and its
  counterparty countersigned it (``replays.is_forward_of``), whoever serves it, so a data node
  that serves no certificate, or a made-up one, decides nothing. A piece nobody serves is
  one the accused failed to serve, and missing evidence loses. Only the accused's own direct
  answer says it keeps none (a forwarder's "not kept" is that route failing), and weights,
  which nobody signs, count against it only when read from it directly: a replay that is off
  only with weights a forwarder passed on is judged with weights two other replicas serve
  identically, read from them directly (WRONG when off), as when the accused keeps none (a
  replica is a worker of the stage with a hop at the iteration among the leaves of the data
  node's certificate on chain that verify against its root: a data node cannot name its own
  sybils with leaves it makes up), and
  voted RIGHT (not shown wrong) without those, so a forwarder makes the accused lose only
  where withholding would have;
* anyone: draw a round whose seed block has passed (evicting a juror that left the registry
  if the draw names one), and execute a ruling whose last window is over.

Vote salts come from the wallet's key, so a restarted juror reveals what it committed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import trio
from libp2p.crypto.keys import KeyPair

from gwtf.contracts.bindings import ContractRevert
from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import (
    BACKWARD,
    CertRef,
    Eip712Domain,
    HopReceipt,
    ledger_domain,
    receipt_digest,
)
from gwtf.contracts.merkle import MAX_PROOF_LENGTH
from gwtf.errors import ChainError
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.audit.replays import (
    EvidenceSource,
    Replayed,
    evidence_source,
    forwarders_of,
    forwards_of,
    replay_sample,
    unreached_of,
    without_unsigned_forwards,
)
from gwtf.node.audit.runner import (
    connect_peers,
    read_certificate_directly,
    read_certificate_over,
    verified_leaves,
)
from gwtf.node.chain.actions import Contracts, draw_salt_of, vote_salt_of
from gwtf.node.chain.adapter import Sender
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.chain.holds import first_dispute_block, logs_since
from gwtf.node.p2p.host import running_host
from gwtf.node.p2p.identity import (
    identity_from_key,
    new_identity,
    node_address_of_peer,
    peer_id_of,
)
from gwtf.node.p2p.rpc import RequestResponse

log = logging.getLogger(__name__)

# Court.Phase and the votes.
SALTS, DRAWING, VOTING, RULED = 1, 2, 3, 4
RIGHT, WRONG = 1, 2
FINAL_ROUND: Final = 3
#: The share of the time left in its commit window a juror may spend retrying evidence, and
#: the share by which its whole evidence phase (certificate, evidence, replay) ends: the rest
#: is for the commit's transaction.
RETRY_SHARE: Final = 0.5
VERDICT_SHARE: Final = 0.75
#: How often a juror reads the chain's block number while it fetches evidence: the blocks
#: of its commit window are its clock.
BLOCK_POLL_S: Final = 1.0

ANSWERED: Final = "answered"
SALT_REVEALED: Final = "draw salt revealed"
DRAWN: Final = "jury drawn"
REARMED: Final = "draw re-armed"
EVICTED: Final = "juror evicted"
COMMITTED: Final = "vote committed"
REVEALED: Final = "vote revealed"
ABSTAINED: Final = "no vote"
RULED_STEP: Final = "ruling executed"
FAILED: Final = "failed"


@dataclass(frozen=True)
class Case:
    """A court case of a tensor dispute, with the disputed receipt the jurors re-execute."""

    case_id: int
    dispute_id: int
    receipt: HopReceipt
    receipt_digest: bytes
    worker_signature: bytes
    challenger: str
    accused_wallet: str
    #: The dispute this one reopens (0: a first dispute), whose draw salt it must not reuse.
    reopens: int = 0
    #: The receipt's proof in the batch ``worker_signature`` signs.
    worker_proof: tuple[bytes, ...] = ()
    #: False when that proof is longer than any a juror checks (``batch_proof_of``): the
    #: case's other steps are taken all the same, and its jurors vote RIGHT.
    checkable: bool = True


@dataclass(frozen=True)
class Step:
    """One thing a pass did for a case."""

    case_id: int
    action: str
    detail: str = ""
    tx_hash: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "case": self.case_id,
            "action": self.action,
            "detail": self.detail,
            "tx_hash": self.tx_hash,
        }


def open_cases(contracts: Contracts) -> list[Case]:
    """Every case not yet ruled, with its dispute's receipt (from the events that opened it)."""
    disputes, court = contracts.disputes, contracts.court
    first = first_dispute_block(contracts)
    if first is None:
        return []
    latest = int(contracts.w3.eth.block_number)
    opened = {
        int(log["args"]["id"]): log["args"]
        for log in logs_since(disputes.events.TensorDisputeOpened, first, latest)
    }
    found = []
    for log in logs_since(disputes.events.TensorDisputeReferred, first, latest):
        case_id, dispute_id = int(log["args"]["caseId"]), int(log["args"]["id"])
        parties, _, _, phase, *_ = court.functions.getCase(case_id).call()
        if int(phase) == RULED:
            continue
        args = opened[dispute_id]
        receipt = HopReceipt(**dict(args["receipt"]))  # web3 decodes a struct as a dict
        digest, signed = bytes(args["receiptDigest"]), args["workerSigned"]
        signature = bytes(signed["signature"])
        proof = batch_proof_of(case_id, signed["proof"])
        challenger, accused_wallet = str(parties[2]), str(parties[1])
        reopens = _reopened_by(disputes, opened, dispute_id, digest, challenger)
        found.append(
            Case(
                case_id, dispute_id, receipt, digest, signature, challenger, accused_wallet,
                reopens, proof or (), proof is not None,
            )
        )  # fmt: skip
    return found


def batch_proof_of(case_id: int, hashes: Sequence[bytes]) -> tuple[bytes, ...] | None:
    """The disputed receipt's batch proof from its opening event, or None (one warning line)
    when it is longer than any proof a juror processes: the ledger refuses such a dispute
    (``Disputes.ProofTooLong``), so only a ledger deployed without that bound emits one, and
    no replay of it could be checked, so a juror votes RIGHT (not shown wrong) rather than
    be fined as absent."""
    if len(hashes) > MAX_PROOF_LENGTH:
        log.warning(
            "case %d: the batch proof has %d hashes, over %d: no juror can check it, "
            "voted RIGHT (not shown wrong)",
            case_id, len(hashes), MAX_PROOF_LENGTH,
        )  # fmt: skip
        return None
    return tuple(bytes(h) for h in hashes)


def _reopened_by(
    disputes: Any, opened: dict[int, Any], dispute_id: int, digest: bytes, challenger: str
) -> int:
    """The dispute ``dispute_id`` reopens: the challenger's latest earlier one on the receipt
    (it has one dispute per receipt, reopened once), or 0 for a first dispute."""
    if not disputes.functions.isReopening(dispute_id).call():
        return 0
    earlier = [
        i
        for i, args in opened.items()
        if i < dispute_id
        and bytes(args["receiptDigest"]) == digest
        and str(args["challenger"]).lower() == challenger.lower()
    ]
    return max(earlier, default=0)


class ReplayerOf(Protocol):
    """The re-executor of a run's hops (by run id), built or loaded on first use: may block
    for as long as loading the run's model takes, and raises when the run's model cannot be
    built here."""

    def __call__(self, run_id: int, /) -> Replayer: ...


async def serve_once(
    contracts: Contracts,
    wallet: Sender,
    peers: Sequence[str],
    replayer_of: ReplayerOf | None,
    timeout_s: float = 20.0,
    block_time_s: float | None = None,
    node_key: bytes | None = None,
) -> list[Step]:
    """One pass over the open cases for ``wallet`` (its juror node is ``Court.jurorOf``),
    re-executing with ``replayer_of(run id)``; without it, every step but the votes.
    A juror's evidence phase ends by the blocks of its commit window, read from the chain
    while it runs; ``block_time_s``: the chain's seconds per block, to end it by the clock
    too (None: by the blocks alone, as a chain's past block times say nothing of the next).
    ``node_key``: the juror node's key, which it dials the run's nodes with, so an accused
    answers it outside the rate all outsiders share (``gwtf.node.chain.seats``); without it,
    when it is not the juror node's, or for a case of a run that node is in (``_in_run``; one
    warning line each), a fresh identity within that rate."""
    steps: list[Step] = []
    node = str(await trio.to_thread.run_sync(_juror_of, contracts, wallet))
    identity = None
    if node_key is not None and int(node, 16) != 0:
        identity = identity_from_key(node_key)
        if node_address_of_peer(peer_id_of(identity)).lower() != node.lower():
            # The party steps (an answer, a salt) must not wait on a juror's key: it dials as
            # an outsider, as without one.
            log.warning(
                "the node key given is not that of %s's juror node %s (give its --node-name): "
                "its evidence fetches share the rate all outsiders get",
                wallet.address, node,
            )  # fmt: skip
            identity = None
    for case in await trio.to_thread.run_sync(open_cases, contracts):
        steps += await trio.to_thread.run_sync(_party_steps, contracts, wallet, case)
        steps += await trio.to_thread.run_sync(_anyone_steps, contracts, wallet, case)
        if replayer_of is not None and int(node, 16) != 0:
            steps += await _juror_steps(
                contracts, wallet, node, case, peers, replayer_of, timeout_s, block_time_s,
                identity,
            )  # fmt: skip
    return steps


def next_due_block(contracts: Contracts, case_id: int) -> int | None:
    """The next block from which some step of the case can be taken that cannot be now
    (a window opening or a deadline passing); None for a ruled case."""
    court = contracts.court
    _, _, opened_at, phase, *_ = court.functions.getCase(case_id).call()
    window = int(court.functions.phaseBlocks().call())
    rounds = court.functions.getRounds(case_id).call()
    last = rounds[-1]
    seed_block, draw_by, drawn_at = int(last[0]), int(last[1]), int(last[2])
    windows = 2 if len(rounds) - 1 == FINAL_ROUND else 3
    candidates = {
        SALTS: [opened_at + window + 1, opened_at + 2 * window + 1],
        DRAWING: [seed_block + 1, draw_by + 1],
        VOTING: [drawn_at + window + 1, drawn_at + 2 * window + 1, drawn_at + windows * window + 1],
    }.get(int(phase))
    if candidates is None:
        return None
    at = _next_block(contracts)
    later = [block for block in candidates if block > at]
    return min(later) if later else at


def _juror_of(contracts: Contracts, wallet: Sender) -> str:
    return str(contracts.court.functions.jurorOf(wallet.address).call())


def _in_run(contracts: Contracts, run_id: int, node: str) -> bool:
    """Whether ``node`` is a member or data node of run ``run_id``: its live node then keeps
    connections to the run's nodes, and a jury host with the same key (so the same peer id)
    would have them keep one connection of the two, the jury host's (py-libp2p trims the one
    past its grace period), and open the live node's streams on it, which the jury host does
    not serve: the live node would lose its hops while the juror fetches. Such a juror dials
    with a fresh identity (one warning line), within the rate all outsiders share, as a juror
    without its key does."""
    ledger = contracts.ledger.functions
    member = bool(ledger.isAdmitted(run_id, node).call())
    member = member or bool(ledger.wasDataNodeBefore(run_id, node, 2**256 - 1).call())
    if member:
        log.warning(
            "juror node %s is in run %s: it dials that run's nodes with a fresh identity (its "
            "own peer id would take its live node's connections), within the rate all "
            "outsiders share", node, run_id,
        )  # fmt: skip
    return member


def _next_block(contracts: Contracts) -> int:
    return int(contracts.w3.eth.block_number) + 1


def _send(contracts: Contracts, wallet: Sender, case_id: int, action: str, fn: Any) -> Step:
    try:
        receipt = contracts.send(wallet, fn)
    except ChainError as exc:  # another caller was first, or a window closed meanwhile
        return Step(case_id, FAILED, f"{action}: {' '.join(str(exc).split())[:300]}")
    return Step(case_id, action, tx_hash=receipt["transactionHash"].hex())


def _party_steps(contracts: Contracts, wallet: Sender, case: Case) -> list[Step]:
    court = contracts.court
    parties, _, opened_at, phase, answered, *_ = court.functions.getCase(case.case_id).call()
    if phase != SALTS:
        return []
    window = int(court.functions.phaseBlocks().call())
    at = _next_block(contracts)
    me = wallet.address.lower()
    accused = {str(parties[0]).lower(), str(parties[1]).lower()}
    if me in accused and not answered and at <= opened_at + window:
        salt = vote_salt_of(wallet, case.case_id, -1, case.receipt.worker)
        return [
            _send(
                contracts,
                wallet,
                case.case_id,
                ANSWERED,
                court.functions.answer(case.case_id, salt),
            )
        ]
    may_reveal = answered or at > opened_at + window
    if me == str(parties[2]).lower() and may_reveal and at <= opened_at + 2 * window:
        salt = draw_salt_of(wallet, case.receipt_digest, reopens=case.reopens)
        fn = court.functions.revealSalt(case.case_id, salt)
        return [_send(contracts, wallet, case.case_id, SALT_REVEALED, fn)]
    return []


def _anyone_steps(contracts: Contracts, wallet: Sender, case: Case) -> list[Step]:
    court = contracts.court
    _, _, opened_at, phase, *_ = court.functions.getCase(case.case_id).call()
    rounds = court.functions.getRounds(case.case_id).call()
    window = int(court.functions.phaseBlocks().call())
    at = _next_block(contracts)
    last = rounds[-1]
    seed_block, draw_by, drawn_at = int(last[0]), int(last[1]), int(last[2])
    if phase == DRAWING and seed_block < at <= draw_by:
        return _draw(contracts, wallet, case.case_id)
    windows = 2 if len(rounds) - 1 == FINAL_ROUND else 3
    due = (
        (phase == SALTS and at > opened_at + 2 * window)
        or (phase == DRAWING and at > draw_by)
        or (phase == VOTING and at > drawn_at + windows * window)
    )
    if due:
        fn = court.functions.executeRuling(case.case_id)
        return [_send(contracts, wallet, case.case_id, RULED_STEP, fn)]
    return []


def _draw(contracts: Contracts, wallet: Sender, case_id: int) -> list[Step]:
    steps: list[Step] = []
    for _ in range(8):  # each retry follows one eviction
        try:
            receipt = contracts.send(wallet, contracts.court.functions.draw(case_id))
        except ContractRevert as exc:
            if exc.name != "JurorInactive":
                return [*steps, Step(case_id, FAILED, f"draw: {exc}")]
            steps.append(
                _send(
                    contracts,
                    wallet,
                    case_id,
                    EVICTED,
                    contracts.court.functions.evict(exc.args[0]),
                )
            )
            continue
        drawn = contracts.court.events.JuryDrawn().process_receipt(receipt)
        action = DRAWN if drawn else REARMED
        return [*steps, Step(case_id, action, tx_hash=receipt["transactionHash"].hex())]
    return steps


async def _juror_steps(
    contracts: Contracts,
    wallet: Sender,
    node: str,
    case: Case,
    peers: Sequence[str],
    replayer_of: ReplayerOf,
    timeout_s: float,
    block_time_s: float | None,
    identity: KeyPair | None = None,
) -> list[Step]:
    court = contracts.court
    case_view = await trio.to_thread.run_sync(court.functions.getCase(case.case_id).call)
    if int(case_view[3]) != VOTING:
        return []
    rounds = await trio.to_thread.run_sync(court.functions.getRounds(case.case_id).call)
    r = len(rounds) - 1
    drawn_at = int(rounds[r][2])
    window = int(court.functions.phaseBlocks().call())
    commitment, seats, choice = court.functions.votes(case.case_id, r, node).call()
    if seats == 0:
        return []
    at = _next_block(contracts)
    salt = vote_salt_of(wallet, case.case_id, r, node)
    if int.from_bytes(commitment, "big") == 0 and drawn_at < at <= drawn_at + window:
        replayer = replayer_of(case.receipt.runId)
        if identity is not None and await trio.to_thread.run_sync(
            _in_run, contracts, case.receipt.runId, node
        ):
            identity = None
        domain = ledger_domain(contracts.w3.eth.chain_id, contracts.ledger.address)
        cert = await trio.to_thread.run_sync(certificate_of, contracts, case.receipt)
        # Retries end while the window still has blocks to spare for the replay and the
        # commit: a juror that retried past it would be fined as absent.
        left = drawn_at + window - at
        blocks = ChainStop(
            lambda: int(contracts.w3.eth.block_number),
            at + int(RETRY_SHARE * left),
            at + int(VERDICT_SHARE * left),
        )
        until = None
        if block_time_s is not None:
            now = trio.current_time()
            left_s = left * block_time_s
            until = (now + RETRY_SHARE * left_s, now + VERDICT_SHARE * left_s)
        vote, why = await _verdict(
            case, peers, replayer, timeout_s, domain, cert, until, blocks, identity
        )
        if vote is None:
            return [Step(case.case_id, ABSTAINED, why)]
        sealed = court.functions.voteCommitment(case.case_id, r, node, vote, salt).call()
        fn = court.functions.commitVote(case.case_id, node, sealed)
        step = await trio.to_thread.run_sync(_send, contracts, wallet, case.case_id, COMMITTED, fn)
        return [Step(step.case_id, step.action, f"{_name(vote)}: {why}", step.tx_hash)]
    in_reveal = drawn_at + window < at <= drawn_at + 2 * window
    if int.from_bytes(commitment, "big") != 0 and choice == 0 and in_reveal:
        for vote in (RIGHT, WRONG):
            if (
                court.functions.voteCommitment(case.case_id, r, node, vote, salt).call()
                == commitment
            ):
                fn = court.functions.revealVote(case.case_id, node, vote, salt)
                step = await trio.to_thread.run_sync(
                    _send, contracts, wallet, case.case_id, REVEALED, fn
                )
                return [Step(step.case_id, step.action, _name(vote), step.tx_hash)]
        return [Step(case.case_id, FAILED, "the commitment on chain is not one this key made")]
    return []


def _name(vote: int) -> str:
    return "wrong tensor" if vote == WRONG else "right tensor"


def certificate_of(contracts: Contracts, receipt: HopReceipt) -> CertRef | None:
    """The certificate on chain of the disputed receipt's data node and epoch (its last
    submission), or None when it submitted none."""
    certs = EpochLedger(contracts, receipt.runId, None).certificates(receipt.epoch)
    mine = [c for c in certs if c.dataNode.lower() == receipt.dataNode.lower()]
    return mine[0] if mine else None


async def _verdict(
    case: Case,
    peers: Sequence[str],
    replayer: Replayer,
    timeout_s: float,
    domain: Eip712Domain,
    cert: CertRef | None,
    until: tuple[float, float] | None = None,
    blocks: ChainStop | None = None,
    identity: KeyPair | None = None,
) -> tuple[int | None, str]:
    """Re-execute the disputed hop: (WRONG or RIGHT, what the replay found), or (None, why)
    when this juror reached no peer at all. Only the leaves of ``cert`` (the data node's
    certificate on chain; None: it has none) that verify against its root name the hop's
    replicas and forwards. A backward's forward is the one its worker signed and its
    counterparty countersigned, from those leaves or from the worker and its counterparty
    themselves. ``until`` (trio clock): when evidence tries stop, and when the whole phase
    does; the accused's evidence is missing (WRONG) only when the accused had its whole
    retry schedule, else it is not shown wrong in time (RIGHT): the accused is never
    convicted for this juror's lateness. ``identity``: the juror node's, to dial with (None:
    a fresh one)."""
    receipt = case.receipt
    if not case.checkable:
        return RIGHT, f"not shown wrong: its batch proof is over {MAX_PROOF_LENGTH} hashes"
    if receipt_digest(receipt, domain) != case.receipt_digest:
        return None, "the disputed receipt is not under this ledger's signing domain"
    retry_until, verdict_until = until if until is not None else (math.inf, math.inf)
    deadline = _Deadline(retry_until)
    with trio.move_on_at(verdict_until) as phase:
        async with trio.open_nursery() as nursery:
            if blocks is not None:
                nursery.start_soon(_watch_blocks, blocks, deadline, phase)
            verdict = await _evidence_verdict(
                case, peers, replayer, timeout_s, domain, cert, deadline, identity
            )
            nursery.cancel_scope.cancel()
        return verdict
    return RIGHT, "not shown wrong in time: this juror's window ended its evidence phase"


@dataclass(frozen=True)
class ChainStop:
    """The chain's block number (``block_of``, blocking) and the blocks at which a juror's
    evidence retries stop and its whole evidence phase ends."""

    block_of: Callable[[], int]
    retries_until: int
    phase_until: int


class _Deadline:
    """When evidence tries stop (trio clock), moved earlier by the chain's blocks; and the
    evidence source it applies to once there is one."""

    def __init__(self, retry_until: float) -> None:
        self.retry_until = retry_until
        self.source: EvidenceSource | None = None

    def stop_retries(self) -> None:
        self.retry_until = min(self.retry_until, trio.current_time())
        if self.source is not None:
            self.source.retry_until = self.retry_until


async def _watch_blocks(blocks: ChainStop, deadline: _Deadline, phase: trio.CancelScope) -> None:
    """Read the chain's block number every ``BLOCK_POLL_S``: stop the evidence retries at
    ``blocks.retries_until``, end the evidence phase at ``blocks.phase_until``."""
    while True:
        try:
            block = await trio.to_thread.run_sync(blocks.block_of)
        except (ChainError, OSError, ValueError) as exc:  # the provider hiccuped: ask again
            log.debug("no block number: %s", exc)
            block = -1
        if block >= blocks.retries_until:
            deadline.stop_retries()
        if block >= blocks.phase_until:
            phase.cancel()
            return
        await trio.sleep(BLOCK_POLL_S)


async def _evidence_verdict(
    case: Case,
    peers: Sequence[str],
    replayer: Replayer,
    timeout_s: float,
    domain: Eip712Domain,
    cert: CertRef | None,
    deadline: _Deadline,
    identity: KeyPair | None,
) -> tuple[int | None, str]:
    receipt = case.receipt
    async with running_host(identity or new_identity()) as host:
        rpc = RequestResponse(host)
        reachable, _ = await connect_peers(host, peers, timeout_s)
        if not reachable:
            return None, "reached no peer of the run: not voting blind"
        source = evidence_source(
            rpc, peers, reachable, {receipt.dataNode.lower()}, receipt.runId, timeout_s,
            None if deadline.retry_until == math.inf else deadline.retry_until,
        )  # fmt: skip
        deadline.source = source
        certified = await _certified(rpc, peers, reachable, cert, domain, timeout_s)
        entry = _entry_of(certified, receipt, case.worker_signature, case.worker_proof)
        known = certified
        if receipt.direction == BACKWARD:
            known = without_unsigned_forwards(certified, receipt, domain)
            known += await forwards_of(source, receipt, domain)
        (replayed,) = await replay_sample(source, replayer, known, [(entry, None)])
    return _vote_of(replayed, source.had_full_schedule(receipt.worker))


def _vote_of(replayed: Replayed, full_schedule: bool = True) -> tuple[int, str]:
    """The vote on ``replayed``; ``full_schedule``: whether the accused had its whole retry
    schedule (no try cut short by this juror)."""
    replay = replayed.replay
    if replay is None and replayed.unverifiable:
        # Off only with weights a forwarder passed on, which nobody signs, and no two replicas
        # served theirs directly: the juror cannot tell whether the worker or the forwarder is
        # off. WRONG would let a forwarder convict; abstaining fines an honest juror as
        # absent; RIGHT says only that the tensor is not shown wrong.
        return RIGHT, f"not shown wrong: {replayed.why_not}"
    if replay is None and not full_schedule:
        # This juror's window cut the accused's tries short: what it has
        # not served is not shown missing, and the accused is not convicted for that.
        return RIGHT, f"not shown wrong in time: {replayed.why_not}"
    if replay is None:
        return WRONG, f"missing evidence loses: {replayed.why_not}"
    return (WRONG if replay.wrong else RIGHT), replay.describe()


async def _certified(
    rpc: RequestResponse,
    peers: Sequence[str],
    reachable: dict[str, str],
    cert: CertRef | None,
    domain: Eip712Domain,
    timeout_s: float,
) -> list[SignedReceipt]:
    """The receipts of ``cert``'s leaves its data node serves that verify against the root on
    chain, read directly or, when it was not reached (at home), through the nodes reached as
    an audit reads it: a leaf that does not verify is one the data node (or a forwarder) made
    up, its own sybils as replicas say, and names nothing."""
    if cert is None:
        return []
    data_node = cert.dataNode.lower()
    peer = reachable.get(data_node)
    if peer is not None:
        fetched, _ = await read_certificate_directly(rpc, cert, peer, timeout_s)
    elif (at_home := unreached_of(peers, reachable).get(data_node)) is not None:
        forwarders = forwarders_of(reachable, {data_node})
        fetched, _, _ = await read_certificate_over(
            rpc, cert, at_home, forwarders, domain, timeout_s
        )
    else:
        return []
    verified = await trio.to_thread.run_sync(verified_leaves, cert, fetched, domain)
    return [entry for entry, _ in verified]


def _entry_of(
    certified: list[SignedReceipt], receipt: HopReceipt, signature: bytes, proof: tuple[bytes, ...]
) -> SignedReceipt:
    for entry in certified:
        if entry.receipt == receipt:
            return entry
    return SignedReceipt(receipt, signature, b"", proof)
