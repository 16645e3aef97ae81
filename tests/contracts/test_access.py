"""Who may call what: one table over every state-changing external function of NodeRegistry,
WorkLedger, Disputes and Court (the receive hook included). Each function is simulated
(eth_call) from every role on one prepared chain where the allowed call would succeed: the
allowed roles succeed, every other role is refused with the function's access error naming
that caller."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest
from eth_utils.crypto import keccak

from gwtf.contracts import fraud_proofs
from gwtf.contracts.artifacts import load_artifacts
from gwtf.contracts.bindings import ContractRevert, call, deploy_contract, deploy_court
from gwtf.contracts.certificate_tree import CertificateTree, tree_of_hops
from gwtf.contracts.encoding import (
    CertifiedHop,
    CertRef,
    certify_hop,
    sign_binding,
)
from gwtf.contracts.fraud_proofs import FraudProof
from tests.contracts.world import EPOCH_S, ETH, STAGES, NodeKey, World, default_capacity

ROLES = (
    "owner",
    "nominee",  # the owner's pending successor (Ownable2Step)
    "sponsor",  # the runs' sponsor, also the wallet of its data nodes
    "wallet_a",  # the wallet of nodes a, a2 and u
    "wallet_b",  # the wallet of node b (slashed)
    "challenger",  # committed to the pending proofs, has a bounty to withdraw
    "stranger",
    "registry",
    "ledger",
    "disputes",
    "court",
)
ANYONE = frozenset(ROLES)


def address_of(w: World, role: str) -> str:
    return str(
        {
            "owner": w.deployer,
            "nominee": w.accomplice,
            "sponsor": w.sponsor,
            "wallet_a": w.wallet(0),
            "wallet_b": w.wallet(1),
            "challenger": w.challenger,
            "stranger": w.stranger,
            "registry": w.registry.address,
            "ledger": w.ledger.address,
            "disputes": w.disputes.address,
            "court": w.court.address,
        }[role]
    )


@dataclass(frozen=True)
class Ctx:
    """The prepared chain: in epoch ``epoch`` of ``run``, every allowed call can succeed."""

    run: int  # open, funded
    closed_run: int  # closed and refundable
    epoch: int  # the epoch in progress; ``epoch - 1`` is open for certificates
    data: NodeKey  # data node of ``run``, has not certified ``epoch - 1``
    data2: NodeKey  # the sponsor's, not yet a data node
    a: NodeKey  # member, worker in ``cert``
    a2: NodeKey  # wallet_a's, not yet a member
    u: NodeKey  # wallet_a's, unbonded: its stake unlocked
    b: NodeKey  # member, worker in ``cert``, slashed for equivocation
    tree: CertificateTree
    cert: CertRef  # data's certificate of epoch 0, settled
    proofs: dict[str, tuple[FraudProof, bytes]]  # valid proofs the challenger committed to
    fresh_registry: Any  # deployed by the owner, no slasher yet
    fresh_ledger: Any  # deployed by the owner, no disputes yet
    fresh_court: Any  # deployed by the owner, no arbitrable yet
    sponsor: str  # the runs' sponsor; a's hop is in tensor dispute 1, court case 1 (open)


def conflicting_receipts(
    w: World, run: int, epoch: int, data: NodeKey, worker: NodeKey, other: NodeKey
) -> FraudProof:
    """``worker`` signs two different receipts of one hop."""
    first = w.receipt(run, epoch, data, worker, other, 0)
    return w.equivocation(worker, first, replace(first, outputDigest=keccak(text="second output")))


def prepare(w: World) -> Ctx:
    registry, ledger = w.registry.functions, w.ledger.functions
    data, data2, liar = (w.register(n, w.sponsor) for n in ("data", "data2", "liar"))
    a, a2, u = (w.register(n, w.wallet(0)) for n in ("a", "a2", "u"))
    b = w.register("b", w.wallet(1), 4 * ETH)
    c = w.register("c", w.wallet(2))
    run = w.open_run()
    w.add_data_node(run, data)
    w.add_data_node(run, liar)
    w.join(run, a, w.wallet(0))
    w.join(run, b, w.wallet(1))
    w.tx(registry.requestUnstake(u.address), w.wallet(0))
    closed_run = w.open_run(ETH)
    w.tx(ledger.closeRun(closed_run), w.sponsor)
    tree = w.certificate_tree(w.pipeline_hops(run, 0, data, [a, b], range(2)))
    cert = w.certify(tree, run, 0, data)
    # Early in the first epoch that starts after epoch 0 settled and u's stake unlocked.
    start = w.call(ledger.getRun(run))[1]
    ready = max(w.epoch_times(run, 0)[3], w.call(registry.unlockAt(u.address)))
    epoch = (ready - start) // EPOCH_S + 1
    w.travel_to(start + epoch * EPOCH_S + 1)
    # The liar certifies epoch - 1 with a tree that breaks every rule a proof can show: its
    # leaf 0 is a hop of a stage the run lacks, with units before it, not chained to leaf 1.
    bad = w.receipt(run, epoch - 1, liar, a, b, 0, stage=STAGES + 1)
    entry = w.signed(bad, a, b)
    leaf0 = certify_hop(
        bad, w.ledger_domain, entry.worker_signature, entry.counterparty_signature, 0, 7
    )
    leaf1 = CertifiedHop(1, 0, b.address, 100, keccak(text="k"), keccak(text="d"), keccak(text="s"))
    # Leaves 2 and 3 are real hops of a's whose tensors the challenger disputes.
    disputed = [w.signed(w.receipt(run, epoch - 1, liar, a, b, m), a, b) for m in (1, 2)]
    leaves = [
        certify_hop(
            e.receipt, w.ledger_domain, e.worker_signature, e.counterparty_signature, 2 + i, 0
        )
        for i, e in enumerate(disputed)
    ]
    liar_tree = w.dishonest_tree([leaf0, leaf1, *leaves])
    liar_cert = w.cert_of(liar_tree, run, epoch - 1, liar.address, units=400)
    w.submit(liar_cert)
    # b equivocated and was slashed: the challenger has a bounty, the disputes contract ETH.
    w.prove(conflicting_receipts(w, run, epoch, data, b, a), w.challenger)
    w.award(b.address)
    pending = {
        "proveInvalidHop": fraud_proofs.invalid_hop(liar_cert, liar_tree.leaf_proof(0), entry),
        "proveBadTotals": fraud_proofs.bad_totals(liar_cert, liar_tree.leaf_proof(0)),
        "proveBadSequence": fraud_proofs.bad_sequence(
            liar_cert, liar_tree.leaf_proof(0), liar_tree.leaf_proof(1)
        ),
        "proveEquivocation": conflicting_receipts(w, run, epoch, data, c, a),
        "openTensorDispute": fraud_proofs.wrong_tensor(
            liar_cert, liar_tree.leaf_proof(2), disputed[0]
        ),
    }
    # Its one span, a's, covers b's leaf 1.
    submitted = tree_of_hops(liar_tree.hops, w.spans[liar_cert.rangesRoot])
    pending["proveBadSpan"] = fraud_proofs.bad_span(
        liar_cert, submitted.span_proof(0), submitted.leaf_proof(1)
    )
    # Each commitment in a block of its own, the last two with no block between them (the
    # next transaction mines one), so that the first is still revealable when the table runs.
    names = list(pending)
    proofs = {name: (pending[name], w.commit(pending[name], w.challenger)) for name in names[:-2]}
    for name in names[-2:]:
        salt = keccak(text=f"{name} salt")
        commitment = fraud_proofs.commitment_of(w.challenger, salt, pending[name].proof_hash)
        w.tx(w.disputes.functions.commit(commitment), w.challenger)
        proofs[name] = (pending[name], salt)
    # A tensor dispute about a's other hop awaits the court (case 1, in its answer window).
    w.prove(fraud_proofs.wrong_tensor(liar_cert, liar_tree.leaf_proof(3), disputed[1]))
    # wallet_a's a2 holds a juror deposit (enough that the court, as a caller, can pay too).
    w.tx(w.court.functions.deposit(a2.address), w.wallet(0), 2 * ETH)
    w.tx(registry.transferOwnership(w.accomplice), w.deployer)
    w.tx(ledger.transferOwnership(w.accomplice), w.deployer)
    w.tx(w.court.functions.transferOwnership(w.accomplice), w.deployer)
    fresh_registry = deploy_contract(w.w3, "NodeRegistry", w.deployer, ETH, 100, w.deployer)
    fresh_ledger = deploy_contract(w.w3, "WorkLedger", w.deployer, w.registry.address, w.deployer)
    fresh_court = deploy_court(w.w3, w.deployer, w.registry.address, w.params)
    return Ctx(
        run, closed_run, epoch, data, data2, a, a2, u, b, tree, cert, proofs, fresh_registry,
        fresh_ledger, fresh_court, w.sponsor,
    )  # fmt: skip


@pytest.fixture
def access(world: World) -> tuple[World, Ctx]:
    return world, world.scenario("access:table", lambda: prepare(world))


class PlainTransfer:
    """A bare ETH transfer to ``to``, shaped like a ContractFunction for ``call``."""

    def __init__(self, w: World, to: str) -> None:
        self.w, self.to = w, to

    def call(self, params: Any, block_identifier: Any = "latest") -> Any:
        transfer: Any = {**params, "to": self.to}
        return self.w.w3.eth.call(transfer, block_identifier)


Build = Callable[[World, Ctx, str], Any]
Refusal = Callable[[Ctx, str], tuple[str, tuple[Any, ...]]]


@dataclass(frozen=True)
class Rule:
    contract: str
    function: str
    allowed: frozenset[str]
    build: Build  # (world, ctx, caller) -> the call
    refusal: Refusal  # (ctx, caller) -> (error, args) for a role not allowed
    value: int = 0
    case: str = ""

    @property
    def id(self) -> str:
        suffix = f"[{self.case}]" if self.case else ""
        return f"{self.contract}.{self.function}{suffix}"


def only(*roles: str) -> frozenset[str]:
    return frozenset(roles)


def unauthorized(ctx: Ctx, caller: str) -> tuple[str, tuple[Any, ...]]:
    return "OwnableUnauthorizedAccount", (caller,)


def not_node_wallet(node: Callable[[Ctx], NodeKey]) -> Refusal:
    return lambda ctx, caller: ("NotNodeWallet", (node(ctx).address, caller))


def not_sponsor(run: Callable[[Ctx], int]) -> Refusal:
    return lambda ctx, caller: ("NotSponsor", (run(ctx), caller))


def no_commitment(name: str) -> Refusal:
    def refusal(ctx: Ctx, caller: str) -> tuple[str, tuple[Any, ...]]:
        proof, salt = ctx.proofs[name]
        return "NoCommitment", (fraud_proofs.commitment_of(caller, salt, proof.proof_hash),)

    return refusal


def never(ctx: Ctx, caller: str) -> tuple[str, tuple[Any, ...]]:
    raise AssertionError("a function anyone may call refused a caller")


def register(w: World, ctx: Ctx, caller: str) -> Any:
    key = w.key(f"access newcomer {caller}")
    signature = sign_binding(caller, key.private_key, w.registry_domain)
    return w.registry.functions.registerNode(key.public_key, default_capacity(), signature)


def claim(worker: Callable[[Ctx], NodeKey]) -> Build:
    def build(w: World, ctx: Ctx, caller: str) -> Any:
        return w.claim_fn(ctx.cert, ctx.tree, worker(ctx))

    return build


def prove(name: str) -> Build:
    def build(w: World, ctx: Ctx, caller: str) -> Any:
        proof, salt = ctx.proofs[name]
        return w.reveal_fn(proof, salt)

    return build


def ownable(contract: str, target: Callable[[World], Any]) -> list[Rule]:
    return [
        Rule(
            contract, "transferOwnership", only("owner"),
            lambda w, c, _: target(w).functions.transferOwnership(w.stranger), unauthorized,
        ),
        Rule(
            contract, "acceptOwnership", only("nominee"),
            lambda w, c, _: target(w).functions.acceptOwnership(), unauthorized,
        ),
        Rule(
            contract, "renounceOwnership", only("owner"),
            lambda w, c, _: target(w).functions.renounceOwnership(), unauthorized,
        ),
    ]  # fmt: skip


RULES: list[Rule] = [
    # ---- NodeRegistry
    Rule(
        "NodeRegistry", "setSlasher", only("owner"),
        lambda w, c, _: c.fresh_registry.functions.setSlasher(w.disputes.address), unauthorized,
    ),
    *ownable("NodeRegistry", lambda w: w.registry),
    Rule("NodeRegistry", "registerNode", ANYONE, register, never, value=ETH),
    Rule(
        "NodeRegistry", "addStake", only("wallet_a"),
        lambda w, c, _: w.registry.functions.addStake(c.a.address), not_node_wallet(lambda c: c.a),
        value=1,
    ),
    Rule(
        "NodeRegistry", "updateCapacity", only("wallet_a"),
        lambda w, c, _: w.registry.functions.updateCapacity(c.a.address, ("H100", 81_920, 9, 2)),
        not_node_wallet(lambda c: c.a),
    ),
    Rule(
        "NodeRegistry", "requestUnstake", only("wallet_a"),
        lambda w, c, _: w.registry.functions.requestUnstake(c.a.address),
        not_node_wallet(lambda c: c.a),
    ),
    Rule(
        "NodeRegistry", "withdrawStake", only("wallet_a"),
        lambda w, c, _: w.registry.functions.withdrawStake(c.u.address),
        not_node_wallet(lambda c: c.u),
    ),
    Rule(
        "NodeRegistry", "slash", only("disputes"),
        lambda w, c, _: w.registry.functions.slash(c.a.address),
        lambda c, caller: ("NotSlasher", (caller,)),
    ),
    Rule(
        "NodeRegistry", "slashUpTo", only("disputes"),
        lambda w, c, _: w.registry.functions.slashUpTo(c.a.address, 1),
        lambda c, caller: ("NotSlasher", (caller,)),
    ),
    Rule(
        "NodeRegistry", "freezeStake", only("disputes"),
        lambda w, c, _: w.registry.functions.freezeStake(c.b.address),
        lambda c, caller: ("NotSlasher", (caller,)),
    ),
    Rule(
        "NodeRegistry", "thawStake", only("disputes"),
        lambda w, c, _: w.registry.functions.thawStake(c.a.address),
        lambda c, caller: ("NotSlasher", (caller,)),
    ),
    # ---- WorkLedger (and its RunBook)
    Rule(
        "WorkLedger", "setDisputes", only("owner"),
        lambda w, c, _: c.fresh_ledger.functions.setDisputes(w.disputes.address), unauthorized,
    ),
    *ownable("WorkLedger", lambda w: w.ledger),
    Rule(
        "WorkLedger", "openRun", ANYONE, lambda w, c, _: w.ledger.functions.openRun(w.run_config()),
        never, value=ETH,
    ),
    Rule(
        "WorkLedger", "fundRun", only("sponsor"), lambda w, c, _: w.ledger.functions.fundRun(c.run),
        not_sponsor(lambda c: c.run), value=1,
    ),
    Rule(
        "WorkLedger", "addDataNode", only("sponsor"),
        lambda w, c, _: w.ledger.functions.addDataNode(c.run, c.data2.address),
        not_sponsor(lambda c: c.run),
    ),
    Rule(
        "WorkLedger", "closeRun", only("sponsor"),
        lambda w, c, _: w.ledger.functions.closeRun(c.run), not_sponsor(lambda c: c.run),
    ),
    Rule(
        "WorkLedger", "withdrawRefund", only("sponsor"),
        lambda w, c, _: w.ledger.functions.withdrawRefund(c.closed_run),
        not_sponsor(lambda c: c.closed_run),
    ),
    Rule(
        "WorkLedger", "joinRun", only("wallet_a"),
        lambda w, c, _: w.ledger.functions.joinRun(c.run, c.a2.address),
        not_node_wallet(lambda c: c.a2),
    ),
    Rule(
        "WorkLedger", "leaveRun", only("wallet_a"),
        lambda w, c, _: w.ledger.functions.leaveRun(c.run, c.a.address),
        not_node_wallet(lambda c: c.a),
    ),
    Rule(
        "WorkLedger", "submitCertificates", only("sponsor"),
        lambda w, c, _: w.ledger.functions.submitCertificates(
            c.run, c.epoch - 1, c.data.address, keccak(text="root"), 1, 100,
            [(c.data.address, 0, 100)],
        ),
        not_node_wallet(lambda c: c.data),
    ),
    Rule(
        "WorkLedger", "voidCertificate", only("disputes"),
        lambda w, c, _: w.ledger.functions.voidCertificate(c.cert.as_tuple()),
        lambda c, caller: ("NotDisputes", (caller,)),
    ),
    Rule(
        "WorkLedger", "claimReward", only("wallet_a"), claim(lambda c: c.a),
        not_node_wallet(lambda c: c.a), case="worker",
    ),
    # b was convicted in a later epoch: its work of epoch 0, which no proof touched, stands.
    Rule(
        "WorkLedger", "claimReward", only("wallet_b"), claim(lambda c: c.b),
        not_node_wallet(lambda c: c.b), case="worker convicted in another epoch",
    ),
    Rule(
        "WorkLedger", "recordConviction", only("disputes"),
        lambda w, c, _: w.ledger.functions.recordConviction(c.run, 0, c.a.address),
        lambda c, caller: ("NotDisputes", (caller,)),
    ),
    # ---- Disputes
    Rule(
        "Disputes", "commit", ANYONE,
        lambda w, c, caller: w.disputes.functions.commit(keccak(text=f"commitment of {caller}")),
        never,
    ),
    *(
        Rule("Disputes", name, only("challenger"), prove(name), no_commitment(name))
        for name in (
            "proveInvalidHop", "proveBadTotals", "proveBadSequence", "proveBadSpan",
            "proveEquivocation",
        )
    ),
    Rule(
        "Disputes", "openTensorDispute", only("challenger"), prove("openTensorDispute"),
        no_commitment("openTensorDispute"), value=10**17 + 3 * 10**15,
    ),
    Rule(
        "Disputes", "rule", only("court"), lambda w, c, _: w.disputes.functions.rule(1, 1),
        lambda c, caller: ("NotCourt", (caller,)),
    ),
    Rule(
        "Disputes", "withdrawCredit", only("challenger"),
        lambda w, c, _: w.disputes.functions.withdrawCredit(),
        lambda c, caller: ("NothingToWithdraw", (caller,)),
    ),
    Rule(
        "Disputes", "receive", only("registry"),
        lambda w, c, _: PlainTransfer(w, w.disputes.address),
        lambda c, caller: ("UnexpectedPayment", (caller,)), value=1,
    ),
    # ---- Court
    Rule(
        "Court", "setArbitrable", only("owner"),
        lambda w, c, _: c.fresh_court.functions.setArbitrable(w.disputes.address), unauthorized,
    ),
    *ownable("Court", lambda w: w.court),
    Rule(
        "Court", "deposit", only("wallet_a"),
        lambda w, c, _: w.court.functions.deposit(c.a2.address), not_node_wallet(lambda c: c.a2),
        value=1,
    ),
    Rule(
        "Court", "withdrawDeposit", only("wallet_a"),
        lambda w, c, _: w.court.functions.withdrawDeposit(c.a2.address, 1),
        not_node_wallet(lambda c: c.a2),
    ),
    Rule(
        "Court", "createDispute", only("disputes"),
        lambda w, c, _: w.court.functions.createDispute(
            (c.b.address, w.wallet(1), w.challenger, w.sponsor, b"\x00" * 32)
        ),
        lambda c, caller: ("NotArbitrable", (caller,)), value=3 * 10**15,
    ),
    Rule(
        "Court", "answer", only("wallet_a"),
        lambda w, c, _: w.court.functions.answer(1, b"\x01" * 32),
        lambda c, caller: ("NotParty", (1, caller)),
    ),
]  # fmt: skip


def outcome(fn: Any, caller: str, value: int) -> tuple[str, tuple[Any, ...]] | None:
    """None when the simulated call succeeds, else its revert."""
    try:
        call(fn, caller, value)
    except ContractRevert as revert:
        return revert.name, revert.args
    return None


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_access_table(access: tuple[World, Ctx], rule: Rule) -> None:
    w, ctx = access
    seen = {}
    for role in ROLES:
        caller = address_of(w, role)
        seen[role] = outcome(rule.build(w, ctx, caller), caller, rule.value)
    expected = {
        role: None if role in rule.allowed else rule.refusal(ctx, address_of(w, role))
        for role in ROLES
    }
    assert seen == expected


# Anyone may close an epoch, but only 90 days after it settled: a prepared chain cannot hold
# that and a settled epoch still open for claims at once. test_rewards.py has a stranger do it.
# Anyone may award a bounty, once: see test_attacks.py; anyone may end a refused dispute's
# grace once it is over: see test_tensor_disputes.py. A court case's later steps belong to
# whoever its phase names (the challenger's salt, the drawn jurors' votes, anyone's draw,
# appeal and ruling, an evicted juror's ousting, fees to whom they are owed), each in a window
# one prepared chain cannot hold at once: test_court.py covers each caller and window.
OUTSIDE_THE_TABLE = {
    ("WorkLedger", "closeEpoch"),
    ("Disputes", "awardBounty"),
    ("Disputes", "releaseAfterGrace"),
    ("Court", "revealSalt"),
    ("Court", "draw"),
    ("Court", "commitVote"),
    ("Court", "revealVote"),
    ("Court", "appeal"),
    ("Court", "executeRuling"),
    ("Court", "evict"),
    ("Court", "withdrawCredit"),
}


def test_the_table_covers_every_state_changing_function() -> None:
    artifacts = load_artifacts()
    listed = {(rule.contract, rule.function) for rule in RULES} | OUTSIDE_THE_TABLE
    functions = set()
    # HopRules (deployed by Disputes) only judges: it must stay without state-changing functions.
    for contract in ("NodeRegistry", "WorkLedger", "Disputes", "Court", "HopRules"):
        for entry in artifacts.get(contract).abi:
            if entry["type"] == "receive" or (
                entry["type"] == "function"
                and entry["stateMutability"] in ("nonpayable", "payable")
            ):
                functions.add((contract, entry.get("name", "receive")))
    assert sorted(functions - listed) == [], "state-changing functions missing from the table"
    assert sorted(listed - functions) == [], "the table lists functions the contracts lack"


def test_the_allowed_calls_really_go_through(access: tuple[World, Ctx]) -> None:
    """The simulations above run against real state: sent as transactions, the allowed calls
    change it (one of each kind of role)."""
    w, ctx = access
    w.tx(w.registry.functions.withdrawStake(ctx.u.address), w.wallet(0))
    assert w.status_of(ctx.u) == 3  # Withdrawn
    w.tx(w.ledger.functions.withdrawRefund(ctx.closed_run), w.sponsor)
    assert w.call(w.ledger.functions.getRun(ctx.closed_run))[5] == 0
    proof, salt = ctx.proofs["proveBadTotals"]
    w.tx(w.reveal_fn(proof, salt), w.challenger)
    assert w.status_of(w.key("liar")) == 4  # Slashed
    w.tx(w.disputes.functions.withdrawCredit(), w.challenger)
    assert w.call(w.disputes.functions.creditWei(w.challenger)) == 0
    w.tx(w.registry.functions.acceptOwnership(), w.accomplice)
    assert w.call(w.registry.functions.owner()) == w.accomplice
