"""The platform's promise, checked by a hypothesis state machine against the chain: **no sequence
of honest behaviour ever yields a valid fraud proof against an honest node, whatever the others
do.**

The honest parties are the sponsor's data node ``D`` and the relays ``H1``-``H3``: they sign and
countersign at most one receipt per hop key, and only hops they did; ``D`` certifies exactly the
acknowledged hops of its microbatches that pass the certification rules when it certifies them
(crashes lose attempts, whose acknowledged hops are still certified; re-sends are new attempts).
The dishonest parties are a second data node of the same sponsor (``E1``, and fresh ones once it
is slashed) and the attacker's relays (``X1``, ``Y1``, fresh ones, and ``Z``, never a member):
they sign conflicting receipts, countersign made-up hops, copy honest receipts and signatures
into their own receipts and trees, submit dishonest trees (lying totals, broken order,
duplicated indices, overlapping ranges, off-schedule units, hops of non-members, ...), unstake,
withdraw and leave when they like.

Every fraud proof that can be built from the public data (every receipt, signature and tree)
is tried against the honest parties and must revert; every real fraud of the dishonest parties
must be convicted while its epoch is open. A Python model predicts each transaction's outcome
(the exact custom error of each revert, each payment to the wei) and after every step:

* no honest node is slashed and no certificate of ``D`` is voided;
* the registry holds exactly ``totalStakedWei``, the sum of the model's stakes;
* the ledger holds the run's pool, each open epoch's unpaid reservations and what it burned
  (voided certificates, closed epochs' unclaimed pay); Disputes holds the unpaid bounties plus
  what was burned; the three together hold what came in less what went out (gas
  is paid by the accounts, so contract balances, not account balances, are compared);
* no epoch ever pays out more than its certificates reserved at the run's price per hop, and a
  node convicted in an epoch is paid nothing of it, but everything else it earned.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from eth_utils.crypto import keccak
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from web3.logs import DISCARD

from gwtf.contracts import fraud_proofs
from gwtf.contracts.bindings import ContractRevert
from gwtf.contracts.certificate_tree import (
    CertificateTree,
    LeafProof,
    SignedReceipt,
    SpanProof,
    build_certificate_tree,
    span_disagreement,
    tree_of_hops,
)
from gwtf.contracts.encoding import (
    CertifiedHop,
    CertRef,
    HopReceipt,
    WorkerSpan,
    hop_key,
    receipt_digest,
    recover_digest_signer,
    scheduled_units,
    sign_receipt,
    signatures_hash,
    signing_digest,
)
from gwtf.contracts.fraud_proofs import FraudProof
from gwtf.contracts.merkle import verify_proof
from gwtf.contracts.rewards import pay_wei
from gwtf.errors import ProtocolError
from tests.contracts.conftest import TEST_PARAMS
from tests.contracts.world import (
    EPOCH_S,
    ETH,
    REWARD_PER_EPOCH,
    STAGES,
    UNITS_PER_HOP,
    WINDOW_S,
    NodeKey,
    World,
    spans_covering,
)

REWARD = REWARD_PER_EPOCH + 1  # the epoch's cap on what its certificates reserve
PRICE = 10**16 + 1  # the run's hop price: odd, so crafted units round down
FUNDING = 2 * REWARD + REWARD // 3  # two full epochs, a capped one, then nothing unless topped up
STAKE = 2 * ETH
MIN_STAKE = ETH  # the run's minimum
BPS = 10_000
ACTIVE, UNBONDING, WITHDRAWN, SLASHED = 1, 2, 3, 4
CLAIM_PERIOD_S = 90 * 24 * 3600  # WorkLedger.CLAIM_PERIOD_S

# label, wallet (an index of World.wallet or a World role), honest, data node, joins the run
CAST: tuple[tuple[str, int | str, bool, bool, bool], ...] = (
    ("D", "sponsor", True, True, False),
    ("E1", "sponsor", False, True, False),
    ("H1", 0, True, False, True),
    ("H2", 1, True, False, True),
    ("H3", 2, True, False, True),
    ("X1", "attacker", False, False, True),
    ("Y1", "accomplice", False, False, True),
    ("Z", "attacker", False, False, False),
)
TREE_KINDS = (
    "valid",
    "copied",
    "reused_signature",
    "off_schedule",
    "non_member",
    "self_countersigned",
    "bad_stage",
    "wrong_epoch",
    "leaf_mismatch",
    "lying_units",
    "phantom_count",
    "leaf0_offset",
    "swapped",
    "duplicate_index",
    "overlap",
    "zero_units",
    "skipped_index",
)


def wallet_of(w: World, spec: int | str) -> str:
    return w.wallet(spec) if isinstance(spec, int) else str(getattr(w, spec))


# ------------------------------------------------------------------ model


@dataclass
class Party:
    """A node as the model knows it: its bond, the write-once times the chain judges by, and
    (for an honest node) every receipt digest it signed, by hop key."""

    label: str
    key: NodeKey
    wallet: str
    honest: bool
    data: bool
    registered_at: int
    stake: int = STAKE
    status: int = ACTIVE
    unbonding_at: int = 0
    slashed_at: int = 0
    joined_at: int = 0
    left_at: int = 0
    data_since: int = 0
    signed: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.key.address

    def bonded_during(self, start: int, end: int) -> bool:
        return (
            self.registered_at < end
            and (self.unbonding_at == 0 or self.unbonding_at > start)
            and (self.slashed_at == 0 or self.slashed_at > start)
        )

    def member_during(self, start: int, end: int) -> bool:
        return (
            self.joined_at != 0
            and self.joined_at < end
            and (self.left_at == 0 or self.left_at > start)
        )

    def admitted(self) -> bool:
        return (
            (self.data_since != 0 or (self.joined_at != 0 and self.left_at == 0))
            and self.status == ACTIVE
            and self.stake >= MIN_STAKE
        )


def pay(units: int) -> int:
    """What ``units`` earn, and what a certificate of them reserves, at the run's price."""
    return pay_wei(units, PRICE, UNITS_PER_HOP)


@dataclass
class Book:
    budget: int = 0
    total: int = 0
    fixed: bool = False
    paid_units: int = 0
    paid_wei: int = 0
    closed: bool = False

    @property
    def reserved(self) -> int:
        """What the ledger still holds for the epoch (at close the rest is burned)."""
        return 0 if self.closed else self.budget - self.paid_wei


@dataclass
class Cert:
    """A submitted certificate, with the receipts behind its leaves (by position) as far as
    they are public."""

    ref: CertRef
    tree: CertificateTree
    entries: list[SignedReceipt | None]
    honest: bool
    kind: str
    voided: bool = False
    tried: int = 0  # own proofs put to the chain so far

    def leaf(self, position: int) -> LeafProof:
        return self.tree.leaf_proof(position)

    def spans(self) -> tuple[WorkerSpan, ...]:
        """The spans submitted with it: its tree's (built with the spans it is submitted with)."""
        return self.tree.spans_or_raise()

    def ranges(self) -> set[tuple[str, int, int, int, int]]:
        """Each span as (worker, first index, last index, units before, units end)."""
        out, first, before = set(), 0, 0
        for span in self.spans():
            out.add((span.worker, first, span.lastIndex, before, span.unitsEnd))
            first, before = span.lastIndex + 1, span.unitsEnd
        return out


@dataclass
class Signature:
    """A signature as published: ``genuine`` when ``signer`` really signed ``receipt`` with it,
    not when an attacker copied ``signer``'s signature of another receipt onto it."""

    receipt: HopReceipt
    signature: bytes
    signer: str
    genuine: bool = True


@dataclass
class CertAttack:
    """A proof against a certificate: invalid hop (with a receipt), bad totals, bad sequence,
    bad span (with a span and its range proof)."""

    kind: str
    cert: Cert
    leaf: LeafProof
    entry: SignedReceipt | None = None
    next_leaf: LeafProof | None = None
    span: SpanProof | None = None

    def proof(self) -> FraudProof:
        if self.kind == "invalid_hop":
            assert self.entry is not None
            return fraud_proofs.invalid_hop(self.cert.ref, self.leaf, self.entry)
        if self.kind == "bad_totals":
            return fraud_proofs.bad_totals(self.cert.ref, self.leaf)
        if self.kind == "bad_span":
            assert self.span is not None
            return fraud_proofs.bad_span(self.cert.ref, self.span, self.leaf)
        assert self.next_leaf is not None
        return fraud_proofs.bad_sequence(self.cert.ref, self.leaf, self.next_leaf)


@dataclass
class Equivocation:
    first: Signature
    second: Signature

    def proof(self) -> FraudProof:
        return fraud_proofs.equivocation(
            self.first.signer,
            self.first.receipt,
            self.first.signature,
            self.second.receipt,
            self.second.signature,
        )


def signer_of(digest: bytes, signature: bytes) -> str | None:
    """Disputes._signer: the recovered address, or None where OpenZeppelin's tryRecover fails."""
    try:
        return recover_digest_signer(digest, signature)
    except ProtocolError:
        return None


def ordered(a: CertifiedHop, b: CertifiedHop) -> bool:
    return a.sort_key() < b.sort_key()


def contradicts_totals(ref: CertRef, hop: CertifiedHop) -> bool:
    return (
        hop.index >= ref.count
        or (hop.index == 0 and hop.unitsBefore != 0)
        or (hop.index == ref.count - 1 and hop.unitsBefore + hop.units != ref.units)
    )


# ------------------------------------------------------------------ the machine


class HonestyMachine(RuleBasedStateMachine):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.w = w = world
        run, start, times = w.scenario("stateful honesty", lambda: build_cast(w))
        self.run, self.start = run, start
        self.domain = w.ledger_domain
        self.parties: dict[str, Party] = {}
        for (label, spec, honest, data, joins), (registered, joined, since) in zip(
            CAST, times, strict=True
        ):
            party = Party(
                label,
                w.key(f"stateful {label}"),
                wallet_of(w, spec),
                honest,
                data,
                registered,
                joined_at=joined if joins else 0,
                data_since=since,
            )
            self.parties[label] = party
        self.by_address = {p.address: p for p in self.parties.values()}
        pending = w.w3.eth.get_block("pending")["timestamp"]
        assert pending == w.now() + 1, "the next block must come one second after the last"
        self.fresh = 0
        self.dishonest_data = "E1"
        # public data: every signature, every fully signed receipt, every tree
        self.signatures: list[Signature] = []
        self.receipts: list[SignedReceipt] = []
        self.certs: list[Cert] = []
        self.equivocations: list[Equivocation] = []  # real ones, by dishonest signers
        self.pending: dict[tuple[str, int], list[SignedReceipt]] = {}  # (data node, epoch)
        self.submitted: set[tuple[str, int]] = set()
        self.microbatches = 0
        self.books: dict[int, Book] = {}
        self.claimed: set[tuple[int, str, str]] = set()
        self.available = FUNDING
        self.credits: dict[str, int] = {}
        self.burned = 0
        self.ledger_burned = 0  # WorkLedger.burnedWei
        # (node, epoch) of each conviction the ledger recorded: no pay there.
        self.convictions: set[tuple[str, int]] = set()
        # Each convicted node's bounty: [leader, bountyWei, finalAfter block, awarded].
        self.bounties: dict[str, list[Any]] = {}
        self.commit_block = 0
        self.paid_in = FUNDING + STAKE * len(CAST)
        self.paid_out = 0
        self.proofs_revealed = True  # check the honest parties' records after the first step
        self.dirty_epochs: set[int] = set()

    # ------------------------------------------------------------ time and parties
    def now(self) -> int:
        return self.w.now()

    def times(self, epoch: int) -> tuple[int, int, int, int]:
        starts = self.start + epoch * EPOCH_S
        return starts, starts + EPOCH_S, starts + 2 * EPOCH_S, starts + 2 * EPOCH_S + WINDOW_S

    def epoch_at(self, t: int) -> int:
        return (t - self.start) // EPOCH_S

    def party(self, address: str) -> Party:
        return self.by_address[address]

    @property
    def D(self) -> Party:
        return self.parties["D"]

    @property
    def E(self) -> Party:
        return self.parties[self.dishonest_data]

    def honest(self) -> list[Party]:
        return [p for p in self.parties.values() if p.honest]

    def relays(self, honest: bool | None = None) -> list[Party]:
        return [
            p
            for p in self.parties.values()
            if not p.data and (honest is None or p.honest == honest)
        ]

    def admitted_relays(self) -> list[Party]:
        return [p for p in self.relays() if p.admitted()]

    def book(self, epoch: int) -> Book:
        self.dirty_epochs.add(epoch)
        return self.books.setdefault(epoch, Book())

    # ------------------------------------------------------------ transactions
    def send(self, fn: Any, sender: str, expected: str | None, value: int = 0) -> Any:
        """Sends ``fn``; asserts it succeeds (``expected`` None) or reverts with ``expected``."""
        if expected is None:
            return self.w.tx(fn, sender, value)
        try:
            self.w.tx(fn, sender, value)
        except ContractRevert as error:
            assert error.name == expected, f"expected {expected}, got {error.name}{error.args}"
            return None
        raise AssertionError(f"expected the revert {expected}, but the transaction succeeded")

    def sign(self, party: Party, receipt: HopReceipt) -> bytes | None:
        """``party``'s signature of ``receipt``; an honest party refuses a second, different
        receipt for a hop key it signed before."""
        key, digest = hop_key(receipt), receipt_digest(receipt, self.domain)
        if party.honest:
            if party.signed.get(key, digest) != digest:
                return None
            party.signed[key] = digest
        signature = sign_receipt(receipt, self.domain, party.key.private_key)
        self.signatures.append(Signature(receipt, signature, party.address))
        return signature

    def receipt(
        self,
        data: Party,
        worker: Party,
        counterparty: Party,
        microbatch: int,
        stage: int,
        direction: int,
        attempt: int,
        epoch: int | None = None,
        **overrides: Any,
    ) -> HopReceipt:
        epoch = self.epoch_at(self.now()) if epoch is None else epoch
        return self.w.receipt(
            self.run,
            epoch,
            data.key,
            worker.key,
            counterparty.key,
            microbatch,
            stage,
            direction,
            attempt,
            **overrides,
        )

    # ------------------------------------------------------------ the chain's rules, in Python
    def hop_valid(self, ref: CertRef, hop: CertifiedHop, entry: SignedReceipt) -> bool:
        """Disputes._isValidHop, on the model's facts."""
        r = entry.receipt
        on_schedule = (
            (r.runId, r.epoch, r.dataNode) == (ref.runId, ref.epoch, ref.dataNode)
            and 1 <= r.stage <= STAGES
            and r.units == scheduled_units(r.direction, UNITS_PER_HOP)
        )
        matches = (hop.worker, hop.units, hop.hopKey) == (r.worker, r.units, hop_key(r))
        if not on_schedule or not matches or r.worker == r.counterparty:
            return False
        signed = entry.signing_digest(self.domain, hop.receiptDigest)
        if signer_of(signed, entry.worker_signature) != r.worker:
            return False
        if signer_of(signed, entry.counterparty_signature) != r.counterparty:
            return False
        start, end, _, _ = self.times(ref.epoch)
        worker, counterparty = self.by_address.get(r.worker), self.by_address.get(r.counterparty)
        if worker is None or counterparty is None:
            return False
        return (
            worker.member_during(start, end)
            and worker.bonded_during(start, end)
            and (
                counterparty.member_during(start, end)
                or (counterparty.data_since != 0 and counterparty.data_since < end)
            )
            and counterparty.bonded_during(start, end)
        )

    def entry_certifiable(self, data: Party, epoch: int, entry: SignedReceipt) -> bool:
        """What the honest data node checks before certifying a hop (the same rules)."""
        ref = CertRef(self.run, epoch, data.address, b"\0" * 32, 1, 1, b"\0" * 32)
        r = entry.receipt
        hop = CertifiedHop(
            0,
            0,
            r.worker,
            r.units,
            hop_key(r),
            receipt_digest(r, self.domain),
            signatures_hash(entry.worker_signature, entry.counterparty_signature),
        )
        return self.hop_valid(ref, hop, entry)

    def judge_cert(self, attack: CertAttack, t: int) -> str | None:
        """The revert a certificate proof gets at time ``t`` (None: it convicts). A tree voided
        by a proof is still judged, but a proof committed after that one changes nothing."""
        verdict = self.judge_leaf(attack, t)
        if verdict is None and attack.cert.voided:
            return "AlreadySlashed"
        return verdict

    def judge_leaf(self, attack: CertAttack, t: int) -> str | None:
        cert, hop = attack.cert, attack.leaf.hop
        if t >= self.times(cert.ref.epoch)[3]:
            return "ChallengePeriodOver"
        if not verify_proof(attack.leaf.proof, cert.ref.root, hop.leaf()):
            return "LeafNotInTree"
        if attack.kind == "invalid_hop":
            entry = attack.entry
            assert entry is not None
            if (
                hop.receiptDigest != receipt_digest(entry.receipt, self.domain)
                or hop.signaturesHash != entry.signatures_hash()
            ):
                return "NotTheLeafsReceipt"
            return "HopValid" if self.hop_valid(cert.ref, hop, entry) else None
        if attack.kind == "bad_totals":
            return None if contradicts_totals(cert.ref, hop) else "TotalsBacked"
        if attack.kind == "bad_span":
            span = attack.span
            assert span is not None
            if not verify_proof(span.proof, cert.ref.rangesRoot, span.span.leaf()):
                return "SpanNotCommitted"
            return None if span_disagreement(span.span, hop) else "SpanConsistent"
        nxt = attack.next_leaf
        assert nxt is not None
        if not verify_proof(nxt.proof, cert.ref.root, nxt.hop.leaf()):
            return "LeafNotInTree"
        if nxt.hop.index == hop.index:
            broken = nxt.hop.leaf() != hop.leaf()
        elif hop.index + 1 == nxt.hop.index:
            chained = hop.unitsBefore + hop.units == nxt.hop.unitsBefore
            broken = not chained or not ordered(hop, nxt.hop)
        else:
            return "LeavesNotAdjacent"
        return None if broken else "SequenceConsistent"

    def judge_equivocation(self, attack: Equivocation, t: int) -> str | None:
        first, second = attack.first.receipt, attack.second.receipt
        if t >= self.times(first.epoch)[3]:
            return "ChallengePeriodOver"
        if hop_key(first) != hop_key(second):
            return "NotSameHop"
        first_digest = receipt_digest(first, self.domain)
        second_digest = receipt_digest(second, self.domain)
        if first_digest == second_digest:
            return "SameReceipt"
        # Each signed as a batch of one (``equivocation`` proofs here carry empty proofs).
        signer = signer_of(signing_digest(first, self.domain), attack.first.signature)
        second_signer = signer_of(signing_digest(second, self.domain), attack.second.signature)
        if signer is None or signer != second_signer:
            return "NotOneSigner"
        # Disputes' rule: one role in both, the worker of both (and counterparty of neither)
        # or the counterparty of both (and not the worker).
        as_worker = signer == first.worker and signer not in (
            first.counterparty,
            second.counterparty,
        )
        as_counterparty = (
            signer == first.counterparty == second.counterparty and signer != first.worker
        )
        if not (as_worker or as_counterparty):
            return "SignerNotParty"
        # A convicted signer's later proof leads for nothing; it is refused unless it convicts
        # the signer in an epoch it was not convicted in yet.
        if signer in self.bounties and (signer, first.epoch) in self.convictions:
            return "AlreadySlashed"
        return None

    def judge_claim(
        self, cert: Cert, first: LeafProof, last: LeafProof, sender: str, t: int
    ) -> tuple[str | None, int]:
        """The revert a claim gets (None: it pays), and the range's units."""
        ref = cert.ref
        if t < self.times(ref.epoch)[3]:
            return "NotSettled", 0
        if self.books[ref.epoch].closed:
            return "ClaimPeriodOver", 0
        if cert.voided:
            return "CertificateNotOpen", 0
        node = first.hop.worker
        to_units = last.hop.unitsBefore + last.hop.units
        claimed = (node, first.hop.index, last.hop.index, first.hop.unitsBefore, to_units)
        if last.hop.worker != node or claimed not in cert.ranges():
            return "NotWorkersRange", 0
        units = to_units - first.hop.unitsBefore
        worker = self.party(node)
        if (ref.epoch, ref.dataNode, node) in self.claimed:
            return "AlreadyClaimed", units
        if (node, ref.epoch) in self.convictions:
            return "ClaimantConvicted", units
        if worker.wallet != sender:
            return "NotNodeWallet", units
        return None, units

    def judge_submission(
        self, data: Party, epoch: int, count: int, units: int, t: int
    ) -> str | None:
        start, opens, closes, _ = self.times(epoch)
        if not opens <= t < closes:
            return "SubmissionClosed"
        if count == 0:
            return "EmptyCertificate"
        if not count * UNITS_PER_HOP <= units <= 2 * count * UNITS_PER_HOP:
            return "UnitsOutOfRange"
        if data.data_since == 0 or data.data_since >= opens:
            return "NotDataNode"
        if not data.bonded_during(start, opens):
            return "NodeNotBonded"  # a data node slashed since still certifies the epoch
        if (data.address, epoch) in self.submitted:
            return "CertificateAlreadySubmitted"
        if pay(units) > min(REWARD - self.book(epoch).budget, self.available):
            return "BudgetShort"
        return None

    # ------------------------------------------------------------ effects
    def slash(self, party: Party, challenger: str, t: int) -> tuple[int, int]:
        """The stake taken and the bounty the challenger now leads for. Every commitment here
        is revealed a block after it is made, so a convicted node's leader keeps the lead."""
        if party.address in self.bounties:
            return 0, 0
        amount = party.stake
        party.stake = 0
        if party.slashed_at == 0:
            party.slashed_at = t
        if party.status != WITHDRAWN:
            party.status = SLASHED
        bounty = amount * TEST_PARAMS.bounty_bps // BPS
        final_after = self.commit_block + TEST_PARAMS.reveal_window_blocks
        self.bounties[party.address] = [challenger, bounty, final_after, False]
        self.burned += amount - bounty
        return amount, bounty

    def award(self, party: Party) -> None:
        """awardBounty: the leader's credit once no earlier commitment can be revealed."""
        bounty = self.bounties.get(party.address)
        block = self.w.w3.eth.block_number + 1
        if bounty is None:
            verdict: str | None = "NotConvicted"
        elif bounty[3]:
            verdict = "BountyAwardedAlready"
        elif block <= bounty[2]:
            verdict = "BountyNotFinal"
        else:
            verdict = None
        fn = self.w.disputes.functions.awardBounty(party.address)
        if self.send(fn, self.w.stranger, verdict) is None or bounty is None:
            return
        leader, amount = bounty[0], bounty[1]
        self.credits[leader] = self.credits.get(leader, 0) + amount
        bounty[3] = True

    def reveal(
        self, proof: FraudProof, judge: Callable[[int], str | None], challenger: str
    ) -> tuple[Any, int]:
        """Commits ``proof``, and reveals it a block later expecting the judge's verdict at
        the reveal's time; returns the receipt of a conviction (None for a revert)."""
        self.proofs_revealed = True
        salt = self.w.commit(proof, challenger)
        self.commit_block = self.w.w3.eth.block_number - 1  # w.commit mines one block after
        t = self.now() + 1
        verdict = judge(t)
        receipt = self.send(self.w.reveal_fn(proof, salt), challenger, verdict)
        return receipt, t

    def convicted(self, receipt: Any, accused: Party, challenger: str, t: int) -> None:
        slashed, bounty = self.slash(accused, challenger, t)
        (event,) = self.w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
        args = event["args"]
        assert (args["node"], args["slashedWei"], args["bountyWei"]) == (
            accused.address,
            slashed,
            bounty,
        )

    def attempt_cert(self, attack: CertAttack, challenger: str) -> bool:
        receipt, t = self.reveal(attack.proof(), lambda t: self.judge_cert(attack, t), challenger)
        if receipt is None:
            return False
        cert = attack.cert
        assert not cert.honest, f"a fraud proof voided the honest certificate {cert.ref}"
        cert.voided = True
        book = self.book(cert.ref.epoch)
        book.total -= cert.ref.units
        book.budget -= pay(cert.ref.units)  # burned, never back in the pool
        self.ledger_burned += pay(cert.ref.units)
        if book.total == 0:
            book.fixed = False
        self.convictions.add((cert.ref.dataNode, cert.ref.epoch))
        self.convicted(receipt, self.party(cert.ref.dataNode), challenger, t)
        return True

    def attempt_equivocation(self, attack: Equivocation, challenger: str) -> bool:
        proof = attack.proof()
        receipt, t = self.reveal(proof, lambda t: self.judge_equivocation(attack, t), challenger)
        if receipt is None:
            return False
        accused = self.party(attack.first.signer)
        assert not accused.honest, f"an equivocation proof convicted the honest {accused.label}"
        self.convictions.add((accused.address, attack.first.receipt.epoch))
        self.convicted(receipt, accused, challenger, t)
        return True

    def submit(self, data: Party, epoch: int, cert: Cert) -> bool:
        t = self.now() + 1
        verdict = self.judge_submission(data, epoch, cert.ref.count, cert.ref.units, t)
        self.w.spans[cert.ref.rangesRoot] = cert.spans()
        fn = self.w.submit_fn(cert.ref)
        if self.send(fn, self.w.sponsor, verdict) is None:
            return False
        self.submitted.add((data.address, epoch))
        book = self.book(epoch)
        book.total += cert.ref.units
        book.budget += pay(cert.ref.units)
        self.available -= pay(cert.ref.units)
        book.fixed = True
        self.certs.append(cert)
        return True

    # ------------------------------------------------------------ honest work
    def microbatch(
        self,
        data: Party,
        route: Sequence[Party],
        crash_at: int | None,
        microbatch: int,
        attempt: int,
        epoch: int,
    ) -> list[SignedReceipt]:
        """One attempt of a microbatch of ``data`` through ``route`` (stage 1, stage 2): forward
        1, forward 2, backward 2, backward 1. A crash at step k loses hop k's countersignature
        (its worker signed it) and everything after; the hops before it were acknowledged."""
        first, second = route
        plan = (
            (1, 0, first, second),
            (2, 0, second, data),
            (2, 1, second, first),
            (1, 1, first, data),
        )
        acknowledged = []
        for step, (stage, direction, worker, counterparty) in enumerate(plan):
            receipt = self.receipt(
                data, worker, counterparty, microbatch, stage, direction, attempt, epoch
            )
            worker_signature = self.sign(worker, receipt)
            assert worker_signature is not None, "a fresh attempt's hop key is new"
            if step == crash_at:
                break
            countersignature = self.sign(counterparty, receipt)
            assert countersignature is not None
            entry = SignedReceipt(receipt, worker_signature, countersignature)
            self.receipts.append(entry)
            acknowledged.append(entry)
        return acknowledged

    def route(self, data: st.DataObject, relays: list[Party]) -> list[Party]:
        first = data.draw(st.sampled_from(relays))
        second = data.draw(st.sampled_from([r for r in relays if r is not first]))
        return [first, second]

    def work(self, data: st.DataObject, node: Party, relays: list[Party]) -> None:
        """A microbatch of ``node``, re-sent as new attempts after each crash (up to 3)."""
        self.microbatches += 1
        epoch = self.epoch_at(self.now())
        pending = self.pending.setdefault((node.address, epoch), [])
        for attempt in range(3):
            crash_at = data.draw(st.sampled_from([None, None, 0, 1, 2, 3]))
            pending += self.microbatch(
                node, self.route(data, relays), crash_at, self.microbatches, attempt, epoch
            )
            if crash_at is None:
                break

    @initialize(data=st.data())
    def first_microbatches(self, data: st.DataObject) -> None:
        self.work(data, self.D, [p for p in self.relays(honest=True) if p.admitted()])
        self.work(data, self.E, self.admitted_relays())

    @precondition(lambda self: len(self.admitted_relays()) >= 2)
    @rule(data=st.data(), honest_only=st.booleans())
    def honest_data_node_works(self, data: st.DataObject, honest_only: bool) -> None:
        """D sends a microbatch through admitted relays (dishonest relays behave while D watches:
        what they do later is their own business)."""
        relays = self.admitted_relays()
        if honest_only and len([r for r in relays if r.honest]) >= 2:
            relays = [r for r in relays if r.honest]
        self.work(data, self.D, relays)

    def enter_window(self, epoch: int) -> bool:
        """Moves to ``epoch``'s submission window if it is still ahead; False once it closed."""
        _, opens, closes, _ = self.times(epoch)
        if self.now() + 1 < opens:
            self.w.travel_to(opens)
        return self.now() + 1 < closes

    def certify(self, data: st.DataObject, epoch: int) -> None:
        """D certifies its acknowledged hops of ``epoch`` that pass the rules now; an attacker
        at once tries two proofs against the new certificate."""
        pending = self.pending.get((self.D.address, epoch), [])
        valid = [e for e in pending if self.entry_certifiable(self.D, epoch, e)]
        if not valid or (self.D.address, epoch) in self.submitted:
            return
        if not self.enter_window(epoch):
            return  # too late: D missed the window (its loss)
        tree = build_certificate_tree(valid, self.domain)
        cert = Cert(
            tree.cert_ref(self.run, epoch, self.D.address),
            tree,
            list(tree.entries),
            honest=True,
            kind="honest",
        )
        for attack in self.attacks_on(cert):  # the model's own check: nothing to prove
            assert self.judge_cert(attack, self.now() + 1) is not None, attack
        assert self.submit(self.D, epoch, cert)
        i = data.draw(st.integers(0, tree.count - 1))
        entry = cert.entries[i]
        assert entry is not None
        assert not self.attempt_cert(
            CertAttack("invalid_hop", cert, cert.leaf(i), entry), self.w.attacker
        )
        assert not self.attempt_cert(self.draw_cert_attack(data, cert), self.w.attacker)

    def d_open_epochs(self) -> list[int]:
        t = self.now() + 1
        return [
            epoch
            for (node, epoch) in self.pending
            if node == self.D.address
            and (node, epoch) not in self.submitted
            and self.times(epoch)[1] <= t < self.times(epoch)[2]
        ]

    @precondition(lambda self: self.d_open_epochs())
    @rule(data=st.data())
    def honest_data_node_certifies(self, data: st.DataObject) -> None:
        for epoch in self.d_open_epochs():
            self.certify(data, epoch)

    # hypothesis orders rules by their number of arguments, then by name, and favours the first
    # that is enabled: D's certifying (when its window is open) and time passing, the only
    # one-argument rules, come first.
    @rule(data=st.data())
    def time_passes(self, data: st.DataObject) -> None:
        choice = data.draw(
            st.sampled_from(
                [
                    "a while",
                    "next epoch",
                    "a while",
                    "settle",
                    "a while",
                    "next epoch",
                    "unbonded",
                    "claims close",
                ]
            )
        )
        extra = data.draw(st.integers(0, 400))
        now = self.now()
        epoch = self.epoch_at(now)
        if choice == "a while":
            target = now + 1 + extra
        elif choice == "next epoch":
            target = self.times(epoch + 1)[0] + extra
        elif choice == "unbonded":  # the first unbonding stake unlocks
            unlocks = [p.unbonding_at for p in self.parties.values() if p.status == UNBONDING]
            target = min(unlocks, default=now) + TEST_PARAMS.unbonding_delay_s + extra // 8
        elif choice == "settle":
            unsettled = [c.ref.epoch for c in self.certs if self.times(c.ref.epoch)[3] > now]
            target = self.times(min(unsettled, default=epoch))[3] + extra // 8
        else:  # months later: the oldest epoch's claim period is over
            target = self.times(min((c.ref.epoch for c in self.certs), default=epoch))[3]
            target += CLAIM_PERIOD_S + extra
        target = max(target, now + 1)
        # Each window that closes meanwhile: D, honest, certifies its work; E submits something.
        first = max(self.epoch_at(now) - 1, 0)
        for e in range(first, min(self.epoch_at(target), first + 3)):
            if self.times(e)[2] > target:
                break
            self.certify(data, e)
            if self.e_submits(data, e) and self.enter_window(e):
                self.e_submit(data, e, data.draw(st.sampled_from(TREE_KINDS)))
        if target > self.now() + 1:
            self.w.travel_to(target)
        if choice == "unbonded":  # wallets take their stake back as soon as it unlocks
            for party in [p for p in self.parties.values() if p.status == UNBONDING]:
                if party.unbonding_at + TEST_PARAMS.unbonding_delay_s <= self.now() + 1:
                    self.withdraw(party)
        # Both data nodes submit early in the window they are now in (E only sometimes).
        open_epoch = self.epoch_at(self.now() + 1) - 1
        if open_epoch >= 0:
            self.certify(data, open_epoch)
            if self.e_submits(data, open_epoch) and data.draw(st.booleans()):
                self.e_submit(data, open_epoch, data.draw(st.sampled_from(TREE_KINDS)))

    # ------------------------------------------------------------ the dishonest
    def dishonest_relays(self) -> list[Party]:
        return self.relays(honest=False)

    @rule(data=st.data(), honest_relays=st.booleans())
    def dishonest_data_node_works(self, data: st.DataObject, honest_relays: bool) -> None:
        """E sends a microbatch through admitted relays, honest ones included; then tries to
        make an honest relay sign a second receipt for a hop it signed (it refuses)."""
        relays = self.admitted_relays()
        if honest_relays and len([r for r in relays if r.honest]) >= 2:
            relays = [r for r in relays if r.honest]
        if len(relays) < 2 or self.E.status != ACTIVE:
            return
        self.work(data, self.E, relays)
        honest_signed = [
            s
            for s in self.signatures
            if s.genuine and self.party(s.signer).honest and s.receipt.dataNode == self.E.address
        ]
        if honest_signed:
            target = data.draw(st.sampled_from(honest_signed))
            conflicting = replace(target.receipt, outputDigest=keccak(os.urandom(32)))
            assert self.sign(self.party(target.signer), conflicting) is None

    def made_up(
        self, worker: Party, counterparty: Party, epoch: int | None = None, **overrides: Any
    ) -> SignedReceipt:
        """A hop that never happened, of E's, signed by its worker and countersigned (an honest
        counterparty countersigns what it was sent, once per hop key)."""
        self.microbatches += 1
        receipt = self.receipt(
            self.E,
            worker,
            counterparty,
            10_000 + self.microbatches,
            overrides.pop("stage", 1),
            overrides.pop("direction", 0),
            0,
            epoch,
            **overrides,
        )
        worker_signature = self.sign(worker, receipt)
        countersignature = self.sign(counterparty, receipt)
        assert worker_signature is not None and countersignature is not None
        entry = SignedReceipt(receipt, worker_signature, countersignature)
        self.receipts.append(entry)
        return entry

    @rule(data=st.data(), action=st.sampled_from(["equivocate", "made_up", "forge"]))
    def adversary_signs(self, data: st.DataObject, action: str) -> None:
        bad = self.dishonest_relays()
        x = data.draw(st.sampled_from(bad))
        epoch = self.epoch_at(self.now())
        if action == "equivocate":
            # x signs two different receipts of one hop, as worker or as counterparty.
            mine = [s for s in self.signatures if s.genuine and s.signer == x.address]
            if mine and data.draw(st.booleans()):
                base = data.draw(st.sampled_from(mine))
            else:
                y = data.draw(st.sampled_from([p for p in self.parties.values() if p is not x]))
                receipt = self.receipt(self.E, x, y, 20_000 + len(self.signatures), 1, 0, 0)
                signature = self.sign(x, receipt)
                assert signature is not None
                base = Signature(receipt, signature, x.address)
            field_name = data.draw(st.sampled_from(["outputDigest", "inputDigest", "iteration"]))
            value = 7 if field_name == "iteration" else keccak(os.urandom(32))
            conflicting = replace(base.receipt, **{field_name: value})
            if conflicting == base.receipt:
                return
            signature = self.sign(x, conflicting)
            assert signature is not None
            self.equivocations.append(
                Equivocation(base, Signature(conflicting, signature, x.address))
            )
            if base.receipt.worker == x.address:  # a colluder countersigns the conflicting one
                counterparty = self.party(base.receipt.counterparty)
                if not counterparty.honest:
                    cs = self.sign(counterparty, conflicting)
                    assert cs is not None
                    self.receipts.append(SignedReceipt(conflicting, signature, cs))
        elif action == "made_up":
            # x countersigns or gets countersigned for work nobody did; honest counterparties
            # countersign once per hop key what they were sent.
            y = data.draw(st.sampled_from([p for p in self.relays() if p is not x]))
            units = data.draw(st.sampled_from([UNITS_PER_HOP, UNITS_PER_HOP + 1]))
            entry = self.made_up(x, y, units=units)
            self.pending.setdefault((self.E.address, epoch), []).append(entry)
            if y.honest:  # ... and refuse a second receipt for that key
                again = replace(entry.receipt, outputDigest=keccak(os.urandom(32)))
                assert self.sign(y, again) is None
        else:
            # x copies a receipt an honest node signed, changes it and re-uses the honest
            # signatures on it (they do not verify for the new digest).
            honest_entries = [
                e
                for e in self.receipts
                if self.party(e.receipt.worker).honest or self.party(e.receipt.counterparty).honest
            ]
            if not honest_entries:
                return
            base_entry = data.draw(st.sampled_from(honest_entries))
            how = data.draw(st.sampled_from(["same key", "to E", "to x"]))
            receipt = base_entry.receipt
            if how == "same key":
                forged = replace(receipt, outputDigest=keccak(os.urandom(32)))
            elif how == "to E":
                forged = replace(receipt, dataNode=self.E.address, epoch=epoch)
            else:
                forged = replace(receipt, worker=x.address)
            entry = SignedReceipt(
                forged, base_entry.worker_signature, base_entry.counterparty_signature
            )
            self.receipts.append(entry)
            for role, signature in (
                ("worker", entry.worker_signature),
                ("counterparty", entry.counterparty_signature),
            ):
                # published as the copied signer's, though it does not verify
                self.signatures.append(Signature(forged, signature, getattr(receipt, role), False))
            self.pending.setdefault((self.E.address, epoch), []).append(entry)

    def e_submits(self, data: st.DataObject, epoch: int) -> bool:
        """Whether E submits for ``epoch`` now: whenever its certificate would be accepted, and
        now and then when it would not (E slashed, unbonded or named too late) to see it
        refused."""
        e = self.E
        if (e.address, epoch) in self.submitted:
            return False
        start, opens, _, _ = self.times(epoch)
        accepted = 0 < e.data_since < opens and e.bonded_during(start, opens)
        return (accepted and e.stake >= MIN_STAKE) or data.draw(st.integers(0, 9)) == 9

    def e_open_epochs(self) -> list[int]:
        epoch = self.epoch_at(self.now() + 1) - 1
        return [epoch] if epoch >= 0 and (self.E.address, epoch) not in self.submitted else []

    @precondition(lambda self: self.e_open_epochs())
    @rule(data=st.data(), kind=st.sampled_from(TREE_KINDS))
    def dishonest_data_node_submits(self, data: st.DataObject, kind: str) -> None:
        """E submits early in its window (time passing makes it submit otherwise)."""
        (epoch,) = self.e_open_epochs()
        self.e_submit(data, epoch, kind)

    def e_submit(self, data: st.DataObject, epoch: int, kind: str) -> None:
        """E builds a tree of ``kind`` from its receipts (and made-up, copied or forged ones) and
        submits it."""
        e = self.E
        x, y = self.parties["X1"], self.parties["Y1"]
        entries = list(self.pending.get((e.address, epoch), []))
        if not entries or data.draw(st.booleans()):
            entries.append(self.made_up(x, y, epoch))
        extra: SignedReceipt | None = None
        if kind == "copied":
            others = [r for r in self.receipts if r.receipt.dataNode != e.address]
            extra = data.draw(st.sampled_from(others)) if others else None
        elif kind == "reused_signature":
            honest = [s for s in self.signatures if s.genuine and self.party(s.signer).honest]
            if honest:
                stolen = data.draw(st.sampled_from(honest))
                receipt = self.receipt(
                    e, self.party(stolen.signer), x, 30_000 + len(self.receipts), 1, 0, 0, epoch
                )
                cs = self.sign(x, receipt)
                assert cs is not None
                extra = SignedReceipt(receipt, stolen.signature, cs)
        elif kind == "off_schedule":
            extra = self.made_up(x, y, epoch, units=UNITS_PER_HOP + 1)
        elif kind == "non_member":
            extra = self.made_up(self.parties["Z"], x, epoch)
        elif kind == "self_countersigned":
            extra = self.made_up(x, x, epoch)
        elif kind == "bad_stage":
            extra = self.made_up(x, y, epoch, stage=data.draw(st.sampled_from([0, STAGES + 1])))
        elif kind == "wrong_epoch":
            extra = self.made_up(x, y, epoch + 1)
        if extra is not None:
            entries.append(extra)
        unique: dict[tuple[int, bytes], SignedReceipt] = {}
        for entry in entries:
            unique.setdefault((int(entry.receipt.worker, 16), hop_key(entry.receipt)), entry)
        base = build_certificate_tree(list(unique.values()), self.domain)
        hops, behind = list(base.hops), list(base.entries)
        n = len(hops)

        def rechain(start: int, before: int) -> None:
            for i in range(start, len(hops)):
                hops[i] = replace(hops[i], index=i, unitsBefore=before)
                before += hops[i].units

        count: int | None = None
        units: int | None = None
        if kind == "leaf_mismatch":
            i = data.draw(st.integers(0, n - 1))
            hops[i] = replace(hops[i], units=hops[i].units + UNITS_PER_HOP)
            rechain(i + 1, hops[i].unitsBefore + hops[i].units)
        elif kind == "lying_units":
            total = hops[-1].unitsBefore + hops[-1].units
            units = (
                total + UNITS_PER_HOP
                if total + UNITS_PER_HOP <= 2 * UNITS_PER_HOP * n
                else total - UNITS_PER_HOP
            )
        elif kind == "phantom_count":
            count = n + 1
            total = hops[-1].unitsBefore + hops[-1].units
            units = max(total, UNITS_PER_HOP * count)
        elif kind == "leaf0_offset":
            rechain(0, UNITS_PER_HOP)
        elif kind == "swapped" and n >= 2:
            i = data.draw(st.integers(0, n - 2))
            hops[i], hops[i + 1] = hops[i + 1], hops[i]
            behind[i], behind[i + 1] = behind[i + 1], behind[i]
            rechain(i, hops[i - 1].unitsBefore + hops[i - 1].units if i else 0)
        elif kind == "duplicate_index" and n >= 2:
            i = data.draw(st.integers(0, n - 2))
            hops[i + 1] = replace(hops[i + 1], index=i)
        elif kind == "overlap" and n >= 2:
            i = data.draw(st.integers(1, n - 1))
            rechain(i, 0)
        elif kind == "skipped_index":  # a gap in the indices, unprovable (see test_rewards)
            gap = data.draw(st.integers(1, 5))
            hops[-1] = replace(
                hops[-1],
                index=hops[-1].index + gap,
                unitsBefore=hops[-1].unitsBefore + gap * UNITS_PER_HOP,
            )
            count = hops[-1].index + 1
        elif kind == "zero_units":  # a worker of its own with a range of 0 units
            hops.append(
                replace(
                    hops[-1],
                    index=n,
                    unitsBefore=hops[-1].unitsBefore + hops[-1].units,
                    units=0,
                    worker=self.parties["Z"].address,
                    hopKey=keccak(os.urandom(32)),
                )
            )
            behind.append(None)
            count = n  # so that the units stay in range; the extra leaf is beyond the count
        last = hops[-1]
        count = len(hops) if count is None else count
        units = last.unitsBefore + last.units if units is None else units
        # The spans E submits partition what it certifies (or the ledger refuses them), however
        # its leaves lie.
        tree = tree_of_hops(hops, spans_covering(hops, count, units))
        assert tree.ranges is not None
        ref = CertRef(self.run, epoch, e.address, tree.root, count, units, tree.ranges.root)
        self.submit(e, epoch, Cert(ref, tree, behind, honest=False, kind=kind))

    # ------------------------------------------------------------ fraud proofs
    def attacks_on(self, cert: Cert) -> list[CertAttack]:
        """Every proof against ``cert`` from its own public data: each leaf with its receipt,
        each leaf's totals, each leaf with itself and its successor, each leaf with the span
        whose indices hold it."""
        attacks = []
        ranges = cert.tree.span_ranges()
        for i in range(cert.tree.count):
            k = next((k for k, r in enumerate(ranges) if r.firstIndex <= i <= r.lastIndex), None)
            if k is not None:
                attacks.append(
                    CertAttack("bad_span", cert, cert.leaf(i), span=cert.tree.span_proof(k))
                )
            leaf = cert.leaf(i)
            entry = cert.entries[i]
            if entry is not None:
                attacks.append(CertAttack("invalid_hop", cert, leaf, entry))
            attacks.append(CertAttack("bad_totals", cert, leaf))
            for j in (i, i + 1):
                if j < cert.tree.count:
                    attacks.append(CertAttack("bad_sequence", cert, leaf, next_leaf=cert.leaf(j)))
        return attacks

    def any_leaf(self, data: st.DataObject) -> LeafProof:
        cert = data.draw(st.sampled_from(self.certs))
        return cert.leaf(data.draw(st.integers(0, cert.tree.count - 1)))

    def draw_cert_attack(self, data: st.DataObject, cert: Cert) -> CertAttack:
        kind = data.draw(st.sampled_from(["own", "mixed", "own"]))
        if kind == "own":  # the certificate's own proofs in turn, so that each reaches the chain
            attacks = self.attacks_on(cert)
            cert.tried += 1
            return attacks[cert.tried % len(attacks)]
        # Anything public: a leaf of any tree, any receipt, any signatures, any second leaf.
        leaf = (
            cert.leaf(data.draw(st.integers(0, cert.tree.count - 1)))
            if data.draw(st.booleans())
            else self.any_leaf(data)
        )
        proof_kind = data.draw(
            st.sampled_from(["invalid_hop", "bad_totals", "bad_sequence", "bad_span"])
        )
        if proof_kind == "invalid_hop":
            entry = data.draw(st.sampled_from(self.receipts))
            how = data.draw(st.sampled_from(["as is", "swapped", "other signatures"]))
            if how == "swapped":
                entry = SignedReceipt(
                    entry.receipt, entry.counterparty_signature, entry.worker_signature
                )
            elif how == "other signatures":
                other = data.draw(st.sampled_from(self.receipts))
                entry = SignedReceipt(
                    entry.receipt, other.worker_signature, other.counterparty_signature
                )
            return CertAttack("invalid_hop", cert, leaf, entry)
        if proof_kind == "bad_totals":
            return CertAttack("bad_totals", cert, leaf)
        if proof_kind == "bad_span":  # a span of any tree
            spanned = data.draw(st.sampled_from(self.certs))
            k = data.draw(st.integers(0, len(spanned.spans()) - 1))
            return CertAttack("bad_span", cert, leaf, span=spanned.tree.span_proof(k))
        return CertAttack("bad_sequence", cert, leaf, next_leaf=self.any_leaf(data))

    def signatures_by(self, party: Party) -> list[Signature]:
        """``party``'s published signatures, those of epochs still open to proofs if any."""
        mine = [s for s in self.signatures if s.signer == party.address]
        t = self.now() + 3
        return [s for s in mine if t < self.times(s.receipt.epoch)[3]] or mine

    def same_hop_pairs(self, party: Party, signatures: list[Signature]) -> list[Equivocation]:
        """Every pair of ``party``'s published signatures (its own or copied onto other
        receipts) on two different receipts of one hop: the first thing an attacker tries."""
        by_key: dict[bytes, list[Signature]] = {}
        for s in signatures:
            if s.signer == party.address:
                by_key.setdefault(hop_key(s.receipt), []).append(s)
        return [
            Equivocation(a, b)
            for group in by_key.values()
            for a in group
            for b in group
            if a.receipt != b.receipt
        ]

    def draw_equivocation_against(self, data: st.DataObject, party: Party) -> Equivocation | None:
        mine = self.signatures_by(party)
        if not mine:
            return None
        pairs = self.same_hop_pairs(party, mine)
        if pairs and data.draw(st.booleans()):
            return data.draw(st.sampled_from(pairs))
        first = data.draw(st.sampled_from(mine))
        key = hop_key(first.receipt)
        same_key = [s for s in self.signatures if hop_key(s.receipt) == key]
        field_name = data.draw(st.sampled_from(["outputDigest", "inputDigest", "counterparty"]))
        x = data.draw(st.sampled_from(self.dishonest_relays()))
        value = x.address if field_name == "counterparty" else keccak(os.urandom(32))
        forged = replace(first.receipt, **{field_name: value})  # same hop key, other contents
        # (hypothesis favours the first choices of a sampled list: the subtle ones come first)
        how = data.draw(
            st.sampled_from(
                [
                    "re-used signature",
                    "other signs both",
                    "other signer",
                    "published same key",
                    "two of its own",
                ]
            )
        )
        if how == "two of its own":
            second = data.draw(st.sampled_from([s for s in mine if s is not first] or mine))
        elif how == "published same key":
            second = data.draw(st.sampled_from(same_key))
        elif how == "re-used signature":  # its real signature on a receipt it never signed
            second = Signature(forged, first.signature, party.address, genuine=False)
        elif how == "other signer":  # a dishonest node signs the forged receipt
            second = Signature(
                forged, sign_receipt(forged, self.domain, x.key.private_key), x.address
            )
        else:  # a dishonest node signs both the honest receipt and the forged one
            first = Signature(
                first.receipt,
                sign_receipt(first.receipt, self.domain, x.key.private_key),
                x.address,
            )
            second = Signature(
                forged, sign_receipt(forged, self.domain, x.key.private_key), x.address
            )
        pair = [first, second]
        if data.draw(st.booleans()):
            pair.reverse()
        return Equivocation(*pair)

    @rule(data=st.data(), aim=st.sampled_from(["certificate", "equivocation", "certificate"]))
    def attack_the_honest(self, data: st.DataObject, aim: str) -> None:
        """Every kind of fraud proof, from every piece of public data, against the honest: all
        revert."""
        for _ in range(2):
            self.attack_once(data, aim)
            aim = data.draw(st.sampled_from(["certificate", "equivocation"]))

    def attack_once(self, data: st.DataObject, aim: str) -> None:
        challenger = data.draw(st.sampled_from([self.w.challenger, self.w.attacker]))
        t = self.now() + 3
        honest_certs = [c for c in self.certs if c.honest]
        open_certs = [c for c in honest_certs if t < self.times(c.ref.epoch)[3]]
        if honest_certs and aim == "certificate":
            cert = data.draw(st.sampled_from(open_certs or honest_certs))
            attack = self.draw_cert_attack(data, cert)
            assert not self.attempt_cert(attack, challenger)
        else:
            party = data.draw(st.sampled_from(self.honest()))
            attack_e = self.draw_equivocation_against(data, party)
            if attack_e is not None:
                # It may convict a dishonest signer of its own receipts; never the honest party
                # (attempt_equivocation asserts the accused is dishonest).
                self.attempt_equivocation(attack_e, challenger)

    def real_frauds(self) -> list[CertAttack | Equivocation]:
        t = self.now() + 3
        frauds: list[CertAttack | Equivocation] = [
            a
            for c in self.certs
            if not c.honest and not c.voided
            for a in self.attacks_on(c)
            if self.judge_cert(a, t) is None
        ]
        frauds += [e for e in self.equivocations if self.judge_equivocation(e, t) is None]
        return frauds

    @rule(data=st.data(), by_stranger=st.booleans())
    def convict_the_dishonest(self, data: st.DataObject, by_stranger: bool) -> None:
        """A real fraud of the dishonest (or a proof against one of their valid trees, or an
        old one): each gets exactly the model's verdict."""
        challenger = self.w.stranger if by_stranger else self.w.challenger
        frauds = self.real_frauds()
        if frauds and data.draw(st.integers(0, 3)):
            kinds = sorted({getattr(f, "kind", "equivocation") for f in frauds})
            kind = data.draw(st.sampled_from(kinds))  # each kind of fraud gets its turn
            attack = data.draw(
                st.sampled_from([f for f in frauds if getattr(f, "kind", "equivocation") == kind])
            )
        else:
            candidates: list[CertAttack | Equivocation] = list(self.equivocations)
            for cert in self.certs:
                if not cert.honest:
                    candidates += self.attacks_on(cert)
            if not candidates:
                return
            attack = data.draw(st.sampled_from(candidates))
        if isinstance(attack, CertAttack):
            self.attempt_cert(attack, challenger)
        else:
            self.attempt_equivocation(attack, challenger)

    # ------------------------------------------------------------ claims
    def claimable(self) -> list[tuple[Cert, str]]:
        return [(c, worker) for c in self.certs for worker in c.tree.workers()]

    @precondition(lambda self: self.certs)
    @rule(data=st.data(), claims=st.integers(1, 4))
    def claims(self, data: st.DataObject, claims: int) -> None:
        """Workers (or strangers) claim ranges, mostly of settled epochs not claimed yet."""
        t = self.now() + 1
        fresh = [
            (c, worker)
            for c, worker in self.claimable()
            if self.times(c.ref.epoch)[3] <= t
            and (c.ref.epoch, c.ref.dataNode, worker) not in self.claimed
        ]
        for _ in range(claims if fresh else 1):
            pool = fresh if fresh and data.draw(st.integers(0, 4)) else self.claimable()
            cert = data.draw(
                st.sampled_from(
                    sorted({id(c): c for c, _ in pool}.values(), key=lambda c: c.honest)
                )
            )
            worker = data.draw(st.sampled_from([wk for c, wk in pool if c is cert]))
            self.claim(data, cert, worker)

    def claim(self, data: st.DataObject, cert: Cert, worker_address: str) -> None:
        w = self.w
        span = cert.tree.worker_range(worker_address)
        assert span is not None
        worker = self.party(worker_address)
        sender = worker.wallet if data.draw(st.integers(0, 4)) else w.stranger
        t = self.now() + 1
        verdict, units = self.judge_claim(cert, span.first, span.last, sender, t)
        before = w.balance(sender)
        receipt = self.send(w.claim_fn(cert.ref, cert.tree, worker.key), sender, verdict)
        if receipt is None:
            return
        ref = cert.ref
        book = self.book(ref.epoch)
        amount = pay(units)
        self.claimed.add((ref.epoch, ref.dataNode, worker_address))
        book.paid_units += units
        book.paid_wei += amount
        if book.paid_units == book.total:  # everything is claimed: the rest is burned
            book.closed = True
            self.ledger_burned += book.budget - book.paid_wei
        gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
        self.paid_out += amount
        (event,) = w.ledger.events.RewardClaimed().process_receipt(receipt, errors=DISCARD)
        assert w.balance(sender) == before - gas + amount
        assert (event["args"]["units"], event["args"]["amountWei"]) == (units, amount)

    # ------------------------------------------------------------ stakes, membership, money
    @rule(
        data=st.data(),
        action=st.sampled_from(
            [
                "unstake",
                "withdraw",
                "leave",
                "new relay",
                "new data node",
                "fund",
                "credit",
                "award",
                "close epoch",
            ]
        ),
    )
    def bonds_and_money(self, data: st.DataObject, action: str) -> None:
        w = self.w
        if action in ("unstake", "withdraw", "leave"):
            honest_admitted = [p for p in self.relays(honest=True) if p.admitted()]
            # An honest relay may leave the network too, while two others stay for D's work.
            candidates = [
                p
                for p in self.parties.values()
                if p is not self.D
                and (not p.honest or len(honest_admitted) > 2 or not p.admitted())
            ]
            able = {  # those for which the action can succeed, tried first
                "unstake": [p for p in candidates if p.status == ACTIVE],
                "withdraw": [p for p in candidates if p.status == UNBONDING],
                "leave": [p for p in candidates if p.joined_at and not p.left_at],
            }[action]
            party = data.draw(
                st.sampled_from(able if able and data.draw(st.integers(0, 3)) else candidates)
            )
            t = self.now() + 1
            if action == "unstake":
                verdict = None if party.status == ACTIVE else "NodeNotActive"
                if (
                    self.send(
                        w.registry.functions.requestUnstake(party.address), party.wallet, verdict
                    )
                    is not None
                ):
                    party.status, party.unbonding_at = UNBONDING, t
            elif action == "withdraw":
                self.withdraw(party)
            else:
                verdict = None if party.joined_at and not party.left_at else "NotMember"
                if (
                    self.send(
                        w.ledger.functions.leaveRun(self.run, party.address), party.wallet, verdict
                    )
                    is not None
                ):
                    party.left_at = t
        elif action == "new relay":
            if len([p for p in self.dishonest_relays() if p.admitted()]) >= 3:
                return
            self.add_party(f"X{self.fresh + 2}", w.attacker, data_node=False)
        elif action == "new data node":
            if self.E.status == ACTIVE:
                return
            label = f"E{self.fresh + 2}"
            self.add_party(label, w.sponsor, data_node=True)
            self.dishonest_data = label
        elif action == "close epoch":
            epochs = sorted({c.ref.epoch for c in self.certs} | {0})
            epoch = data.draw(st.sampled_from(epochs))
            book = self.book(epoch)
            t = self.now() + 1
            verdict = (
                "ClaimPeriodOpen"
                if t < self.times(epoch)[3] + CLAIM_PERIOD_S
                else "ClaimPeriodOver"
                if book.closed
                else None
            )
            if (
                self.send(w.ledger.functions.closeEpoch(self.run, epoch), w.stranger, verdict)
                is not None
            ):
                self.ledger_burned += book.budget - book.paid_wei
                book.closed = True
        elif action == "fund":
            amount = data.draw(st.integers(1, REWARD))
            self.send(w.ledger.functions.fundRun(self.run), w.sponsor, None, amount)
            self.available += amount
            self.paid_in += amount
        elif action == "award":
            if data.draw(st.booleans()):
                w.tester.mine_blocks(TEST_PARAMS.reveal_window_blocks)
            self.award(
                data.draw(st.sampled_from(sorted(self.parties.values(), key=lambda p: p.label)))
            )
        else:
            account = data.draw(st.sampled_from([w.challenger, w.stranger, w.attacker]))
            owed = self.credits.get(account, 0)
            verdict = None if owed else "NothingToWithdraw"
            if self.send(w.disputes.functions.withdrawCredit(), account, verdict) is not None:
                self.credits[account] = 0
                self.paid_out += owed

    def withdraw(self, party: Party) -> None:
        t = self.now() + 1
        unlock = party.unbonding_at + TEST_PARAMS.unbonding_delay_s
        verdict = (
            "NodeNotUnbonding"
            if party.status != UNBONDING
            else "StakeStillLocked"
            if t < unlock
            else None
        )
        fn = self.w.registry.functions.withdrawStake(party.address)
        if self.send(fn, party.wallet, verdict) is not None:
            # The promise of the unbonding delay: every epoch it was bonded in has settled.
            last = self.epoch_at(party.unbonding_at)  # the last epoch it can have been bonded in
            for epoch in range(max(last - 3, 0), last + 1):
                if party.bonded_during(*self.times(epoch)[:2]):
                    assert t >= self.times(epoch)[3], (
                        f"{party.label} withdrew before {epoch} settled"
                    )
            self.paid_out += party.stake
            party.stake, party.status = 0, WITHDRAWN

    def add_party(self, label: str, wallet: str, data_node: bool) -> None:
        w = self.w
        self.fresh += 1
        key = w.register(f"stateful {label}", wallet, STAKE)
        party = Party(label, key, wallet, honest=False, data=data_node, registered_at=self.now())
        if data_node:
            w.add_data_node(self.run, key)
            party.data_since = self.now()
        else:
            w.join(self.run, key, wallet)
            party.joined_at = self.now()
        self.parties[label] = party
        self.by_address[key.address] = party
        self.paid_in += STAKE

    # ------------------------------------------------------------ invariants
    @invariant()
    def no_public_data_convicts_the_honest(self) -> None:
        """The search an attacker runs offline, judged by the model (the chain's rules): no pair
        of an honest node's published signatures, and no proof from the data of an honest
        certificate, convicts. (The attack rule puts samples of both to the chain.)"""
        t = self.now() + 3
        for party in self.honest():
            for pair in self.same_hop_pairs(party, self.signatures):
                assert self.judge_equivocation(pair, t) is not None, (party.label, pair)
        for cert in self.certs:
            if cert.honest and t < self.times(cert.ref.epoch)[3]:
                for attack in self.attacks_on(cert):
                    assert self.judge_cert(attack, t) is not None, attack

    @invariant()
    def honest_nodes_are_never_convicted(self) -> None:
        if not self.proofs_revealed:
            return  # only a revealed proof can slash or void
        self.proofs_revealed = False
        w = self.w
        for party in self.honest():
            node = w.call(w.registry.functions.getNode(party.address))
            assert node[2] != SLASHED and node[5] == 0, f"honest {party.label} was slashed"
        for cert in self.certs:
            if cert.honest:
                stored = w.call(
                    w.ledger.functions.certificateCommitment(
                        self.run, cert.ref.epoch, cert.ref.dataNode
                    )
                )
                assert stored == cert.ref.commitment(), f"D's certificate {cert.ref} was voided"

    @invariant()
    def ether_is_where_the_model_says(self) -> None:
        w = self.w
        staked = sum(p.stake for p in self.parties.values())
        registry_balance = w.balance(w.registry.address)
        assert registry_balance == staked
        assert w.call(w.registry.functions.totalStakedWei()) == staked
        reserved = sum(book.reserved for book in self.books.values())
        ledger_balance = w.balance(w.ledger.address)
        assert ledger_balance == self.available + reserved + self.ledger_burned
        assert w.call(w.ledger.functions.burnedWei()) == self.ledger_burned
        assert w.call(w.ledger.functions.getRun(self.run))[5] == self.available
        disputes_balance = w.balance(w.disputes.address)
        pending = sum(b[1] for b in self.bounties.values() if not b[3])
        assert disputes_balance == sum(self.credits.values()) + self.burned + pending
        assert registry_balance + ledger_balance + disputes_balance == self.paid_in - self.paid_out

    @invariant()
    def epoch_books_match_and_no_epoch_pays_more_than_its_budget(self) -> None:
        for epoch in sorted(self.dirty_epochs):
            book = self.books[epoch]
            on_chain = self.w.call(self.w.ledger.functions.epochBook(self.run, epoch))
            assert tuple(on_chain) == (
                book.budget,
                book.total,
                book.fixed,
                book.paid_units,
                book.paid_wei,
                book.closed,
            )
            assert book.paid_wei <= book.budget
        self.dirty_epochs.clear()


def build_cast(w: World) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Registers the cast, opens the run, names the data nodes and joins the relays; returns the
    run, its start and each party's (registeredAt, joinedAt, dataNodeSince). It all happens
    100 days ahead: eth-tester stamps a block with the wall clock when that is later than its
    parent + 1, and the model needs each transaction to be one second after the last."""
    w.travel_to(w.now() + 100 * 24 * 3600)
    keys = {}
    registered = {}
    for label, spec, *_ in CAST:
        keys[label] = w.register(f"stateful {label}", wallet_of(w, spec), STAKE)
        registered[label] = w.now()
    run = w.open_run(FUNDING, rewardPerEpochWei=REWARD, hopPriceWei=PRICE)
    start = int(w.call(w.ledger.functions.getRun(run))[1])
    joined, since = {}, {}
    for label, spec, _, data, joins in CAST:
        if data:
            w.add_data_node(run, keys[label])
            since[label] = w.now()
        elif joins:
            w.join(run, keys[label], wallet_of(w, spec))
            joined[label] = w.now()
    assert w.epoch_times(run, 3) == (
        start + 3 * EPOCH_S,
        start + 4 * EPOCH_S,
        start + 5 * EPOCH_S,
        start + 5 * EPOCH_S + WINDOW_S,
    )
    times = [(registered[lb], joined.get(lb, 0), since.get(lb, 0)) for lb, *_ in CAST]
    return run, start, times


def run_machine(world: World, examples: int, steps: int) -> None:
    run_on_own_thread(lambda: HonestyMachine(world), examples, steps)


def run_on_own_thread(
    machine: Callable[[], RuleBasedStateMachine], examples: int, steps: int
) -> None:
    """Runs a state machine on a thread of its own. Under pytest the main thread's Python stack
    is deep, and py-evm's recursion then keeps crossing one of CPython 3.11's frame-stack chunk
    boundaries, mapping and unmapping a chunk each time (about 1.5 million mmap/munmap pairs in
    a default run): a fresh thread's stack halves the run time."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=steps,
                    deadline=None,
                    suppress_health_check=[
                        HealthCheck.function_scoped_fixture,
                        HealthCheck.too_slow,
                    ],
                ),
            )
        except BaseException as error:  # re-raised on the test's thread
            failure.append(error)

    thread = threading.Thread(target=target, name="state machine")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def test_no_honest_behaviour_yields_a_valid_fraud_proof(world: World) -> None:
    # A short search by default (each step is several transactions); the slow run below
    # searches 32 times as many steps.
    run_machine(world, examples=5, steps=20)


@pytest.mark.slow
def test_no_honest_behaviour_yields_a_valid_fraud_proof_deeply(world: World) -> None:
    run_machine(world, examples=80, steps=40)
