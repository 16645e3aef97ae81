"""A hypothesis state machine drives the contracts with random stakes, unstakes, withdrawals,
honest and fraudulent epoch claims, fraud proofs and reward claims, and checks them against a
small Python model: stakes held == sum of stakes, the ledger's ETH == pool + unpaid budgets +
credits, rewards paid <= what went into the reward pool (the sponsor's funding, and slashed
stake less the challenger's bounty), and no claim is ever paid twice."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
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

from contracts.bindings import ContractRevert
from contracts.encoding import ClaimRef
from contracts.epoch_tree import EpochTree
from tests.contracts.world import ETH, REWARD_PER_EPOCH, NodeKey, World

BOUNTY_BPS = 5_000
RUN_FUNDING = 4 * ETH  # one full epoch budget, then a capped one


@dataclass
class ModelNode:
    key: NodeKey
    wallet: str
    stake: int
    status: str = "active"  # active | unbonding | withdrawn | slashed
    unlock_at: int = 0


@dataclass
class ModelClaim:
    claim: ClaimRef
    tree: EpochTree
    honest: bool
    state: str = "live"  # live | voided | paid


@dataclass
class ModelEpoch:
    open_units: int = 0
    unpaid_budget: int = 0


@dataclass
class Model:
    nodes: list[ModelNode] = field(default_factory=list)
    claims: list[ModelClaim] = field(default_factory=list)
    epochs: dict[int, ModelEpoch] = field(default_factory=dict)
    available: int = RUN_FUNDING
    credits: int = 0
    paid: int = 0
    funded: int = RUN_FUNDING  # into the reward pool: funding, and slashed stake less bounties


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.w = world
        self.run, self.data_node = world.scenario("stateful", self._build)
        self.model = Model()
        self.labels = 0

    def _build(self) -> tuple[int, NodeKey]:
        w = self.w
        run = w.open_run(funding_wei=RUN_FUNDING)
        data_node = w.register("data", w.wallet(3), 2 * ETH)
        w.join(run, data_node, w.wallet(3))
        return run, data_node

    # ---------------------------------------------------------------- stake
    @initialize(stakes=st.tuples(st.integers(1, 3), st.integers(1, 3)))
    def two_nodes(self, stakes: tuple[int, int]) -> None:
        for wallet, stake_eth in enumerate(stakes):
            self.register(wallet, stake_eth)

    @precondition(lambda self: len(self.model.nodes) < 4)
    @rule(wallet=st.integers(0, 2), stake_eth=st.integers(1, 3))
    def register(self, wallet: int, stake_eth: int) -> None:
        self.labels += 1
        key = self.w.register(f"m{self.labels}", self.w.wallet(wallet), stake_eth * ETH)
        self.w.join(self.run, key, self.w.wallet(wallet))
        self.model.nodes.append(ModelNode(key, self.w.wallet(wallet), stake_eth * ETH))

    def _pick(self, data: st.DataObject, status: str) -> ModelNode | None:
        candidates = [n for n in self.model.nodes if n.status == status]
        return data.draw(st.sampled_from(candidates)) if candidates else None

    @precondition(lambda self: any(n.status == "active" for n in self.model.nodes))
    @rule(data=st.data(), amount=st.integers(1, 10**18))
    def add_stake(self, data: st.DataObject, amount: int) -> None:
        node = self._pick(data, "active")
        if node:
            self.w.tx(self.w.registry.functions.addStake(node.key.address), node.wallet, amount)
            node.stake += amount

    @precondition(lambda self: any(n.status == "active" for n in self.model.nodes))
    @rule(data=st.data())
    def request_unstake(self, data: st.DataObject) -> None:
        node = self._pick(data, "active")
        if node:
            self.w.tx(self.w.registry.functions.requestUnstake(node.key.address), node.wallet)
            node.status, node.unlock_at = (
                "unbonding",
                self.w.now() + self.w.params.unbonding_delay_s,
            )

    @precondition(lambda self: any(n.status == "unbonding" for n in self.model.nodes))
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        node = self._pick(data, "unbonding")
        if node:
            if self.w.now() < node.unlock_at:
                self.w.travel_to(node.unlock_at)
            self.w.tx(self.w.registry.functions.withdrawStake(node.key.address), node.wallet)
            node.status, node.stake = "withdrawn", 0

    # ---------------------------------------------------------------- claims
    @rule(data=st.data())
    def work_an_epoch(self, data: st.DataObject) -> None:
        w = self.w
        epoch = w.ledger.functions.currentEpoch(self.run).call()
        w.travel_to(w.epoch_times(self.run, epoch)[0] + 1)
        for node in [n for n in self.model.nodes if n.status == "active"]:
            kind = data.draw(st.sampled_from(["honest", "stolen", "idle"]))
            if kind == "idle":
                continue
            worker, counterparty = (
                (node.key, self.data_node) if kind == "honest" else (self.data_node, node.key)
            )
            tree = w.honest_tree(
                self.run, epoch, worker, counterparty, count=data.draw(st.integers(1, 3))
            )
            claim = tree.claim(self.run, epoch, node.key.address)
            w.submit(claim, node.wallet)
            book = self.model.epochs.setdefault(epoch, ModelEpoch())
            if not any(c.claim.epoch == epoch for c in self.model.claims):
                budget = min(REWARD_PER_EPOCH, self.model.available)
                self.model.available -= budget
                book.unpaid_budget = budget
            book.open_units += claim.units
            self.model.claims.append(ModelClaim(claim, tree, honest=kind == "honest"))

    def _provable(self) -> list[ModelClaim]:
        now = self.w.now()
        return [
            c
            for c in self.model.claims
            if c.state == "live"
            and not c.honest
            and now + 1 < self.w.epoch_times(self.run, c.claim.epoch)[3]
        ]

    @precondition(lambda self: self._provable())
    @rule(data=st.data())
    def prove_fraud(self, data: st.DataObject) -> None:
        w = self.w
        provable = self._provable()
        target = data.draw(st.sampled_from(provable))
        fn = w.ledger.functions.proveWrongWorker(
            target.claim.as_tuple(), target.tree.leaf_proof(0).as_tuple()
        )
        w.tx(fn, w.challenger)
        node = next(n for n in self.model.nodes if n.key.address == target.claim.node)
        slashed, node.stake = node.stake, 0
        if node.status != "withdrawn":
            node.status = "slashed"
        bounty = slashed * BOUNTY_BPS // 10_000
        self.model.credits += bounty
        self.model.available += slashed - bounty
        self.model.funded += slashed - bounty  # the pool pays honest work with it
        target.state = "voided"
        book = self.model.epochs[target.claim.epoch]
        book.open_units -= target.claim.units
        if book.open_units == 0:
            self.model.available += book.unpaid_budget
            book.unpaid_budget = 0

    @precondition(lambda self: any(c.state == "live" for c in self.model.claims))
    @rule(data=st.data())
    def claim_reward(self, data: st.DataObject) -> None:
        w = self.w
        live = [c for c in self.model.claims if c.state == "live"]
        target = data.draw(st.sampled_from(live))
        settles_at = w.epoch_times(self.run, target.claim.epoch)[3]
        if w.now() < settles_at:
            w.travel_to(settles_at + 1)
        wallet = next(n.wallet for n in self.model.nodes if n.key.address == target.claim.node)
        receipt = w.tx(w.ledger.functions.claimReward(target.claim.as_tuple()), wallet)
        (event,) = w.ledger.events.RewardClaimed().process_receipt(receipt)
        book = self.model.epochs[target.claim.epoch]
        expected = book.unpaid_budget * target.claim.units // book.open_units
        assert event["args"]["amountWei"] == expected
        book.unpaid_budget -= expected
        book.open_units -= target.claim.units
        self.model.paid += expected
        target.state = "paid"
        with pytest.raises(ContractRevert) as excinfo:  # never twice
            w.tx(w.ledger.functions.claimReward(target.claim.as_tuple()), wallet)
        assert excinfo.value.name == "ClaimNotOpen"

    @precondition(lambda self: self.model.credits > 0)
    @rule()
    def challenger_withdraws_credit(self) -> None:
        self.w.tx(self.w.ledger.functions.withdrawCredit(), self.w.challenger)
        self.model.credits = 0

    # ---------------------------------------------------------------- invariants
    @invariant()
    def stakes_are_held(self) -> None:
        staked = sum(n.stake for n in self.model.nodes) + 2 * ETH  # + the data node
        assert self.w.registry.functions.totalStakedWei().call() == staked
        assert self.w.balance(self.w.registry.address) == staked

    @invariant()
    def ledger_balance_is_accounted(self) -> None:
        m = self.model
        unpaid = sum(book.unpaid_budget for book in m.epochs.values())
        assert self.w.ledger.functions.getRun(self.run).call()[5] == m.available
        assert self.w.balance(self.w.ledger.address) == m.available + unpaid + m.credits
        for epoch, book in m.epochs.items():
            on_chain = self.w.ledger.functions.epochBook(self.run, epoch).call()
            assert (on_chain[0], on_chain[1]) == (book.open_units, book.unpaid_budget)

    @invariant()
    def rewards_never_exceed_funding(self) -> None:
        assert self.model.paid <= self.model.funded


def run_machine(world: World, examples: int, steps: int) -> None:
    run_state_machine_as_test(
        lambda: LedgerMachine(world),
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )


def test_contracts_follow_the_model(world: World) -> None:
    run_machine(world, examples=5, steps=12)


@pytest.mark.slow
def test_contracts_follow_the_model_deeply(world: World) -> None:
    run_machine(world, examples=40, steps=25)
