"""Money under collusion, checked by a hypothesis state machine against the chain: **whatever up
to five colluding wallets do, the sponsor's among them, no honest node's balance ever falls, and
no wei appears or disappears.**

The colluders are the sponsor (its data node ``D`` certifies every epoch), the attacker and the
accomplice (relays ``X`` and ``Y``), the challenger and the stranger. They certify honest or
padded trees (extra hops of their own relays), open frivolous tensor disputes against honest
hops and carry them through the court or abandon them, equivocate and report themselves from
another wallet, try to frame honest relays with their published signatures, claim, award
bounties, unstake, withdraw and close epochs. The honest parties are the relays ``H1`` and
``H2`` (they work, answer disputes and claim each settled epoch at once) and eight jurors, who
re-execute and vote the truth.

After every step:

* each honest wallet's value never falls: its balance with the gas it paid added back, plus
  its nodes' stakes, its credits in Disputes and the Court and its juror deposit (a juror's is
  checked after each step that reaches the court or its wallet, the only ones that can move
  it: eth-tester's calls are slow);
* an honest relay's claim of a settled epoch never reverts;
* ETH is conserved: every account and contract together hold what they held at the start, less
  the gas paid; the registry holds exactly the stakes and the ledger exactly the run's pool, the
  open epochs' unpaid reservations and what it burned.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from gwtf.contracts import fraud_proofs
from gwtf.contracts.bindings import ContractRevert
from gwtf.contracts.certificate_tree import CertificateTree, SignedReceipt
from gwtf.contracts.encoding import CertRef
from tests.contracts.jury import (
    RIGHT,
    Juror,
    answer,
    draw,
    execute,
    honest,
    mine_to,
    open_case,
    phase_blocks,
    reveal_salt,
    seat_jurors,
    vote,
)
from tests.contracts.test_stateful import run_on_own_thread
from tests.contracts.world import ETH, NodeKey, World

CLAIM_PERIOD_S = 90 * 24 * 3600  # WorkLedger.CLAIM_PERIOD_S


@dataclass(frozen=True)
class Cast:
    run: int
    data: NodeKey
    honest: tuple[NodeKey, NodeKey]
    colluding: tuple[NodeKey, NodeKey]
    jurors: list[Juror]


@dataclass(frozen=True)
class Certificate:
    epoch: int
    ref: CertRef
    tree: CertificateTree


def build_cast(w: World) -> Cast:
    jurors = seat_jurors(w)
    data = w.register("colluders D", w.sponsor, 2 * ETH)
    h1 = w.register("colluders H1", w.wallet(0), 2 * ETH)
    h2 = w.register("colluders H2", w.wallet(1), 2 * ETH)
    x = w.register("colluders X", w.attacker, 2 * ETH)
    y = w.register("colluders Y", w.accomplice, 2 * ETH)
    run = w.open_run(10 * ETH)
    w.add_data_node(run, data)
    for key, wallet in ((h1, w.wallet(0)), (h2, w.wallet(1)), (x, w.attacker), (y, w.accomplice)):
        w.join(run, key, wallet)
    return Cast(run, data, (h1, h2), (x, y), jurors)


class CollusionMachine(RuleBasedStateMachine):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.w = w = world
        self.cast = w.scenario("colluders", lambda: build_cast(w))
        self.wallet_of = {
            self.cast.honest[0].address: w.wallet(0),
            self.cast.honest[1].address: w.wallet(1),
            self.cast.colluding[0].address: w.attacker,
            self.cast.colluding[1].address: w.accomplice,
        }
        self.colluders = [w.sponsor, w.attacker, w.accomplice, w.challenger, w.stranger]
        self.relay_wallets = [w.wallet(0), w.wallet(1)]
        self.juror_wallets = [j.wallet for j in self.cast.jurors]
        self.honest_wallets = self.relay_wallets + self.juror_wallets
        self.juror_of = {j.wallet: j.node for j in self.cast.jurors}
        self.nodes_of = {
            wallet: [n for n, owner in self.wallet_of.items() if owner == wallet]
            + [j.node for j in self.cast.jurors if j.wallet == wallet]
            for wallet in self.honest_wallets
        }
        self.contracts = [w.registry.address, w.ledger.address, w.disputes.address]
        self.contracts.append(w.court.address)
        self.accounts = sorted(set(w.w3.eth.accounts))
        self.fees: dict[str, int] = {}
        self.scanned = w.w3.eth.block_number
        self.total = self.holdings()
        self.certs: list[Certificate] = []
        self.next_epoch = 0
        self.claimed: set[tuple[int, str]] = set()
        self.value = {wallet: self.value_of(wallet) for wallet in self.honest_wallets}

    # ------------------------------------------------------------ accounting
    def scan_fees(self) -> None:
        """The gas of every transaction mined since the last scan, per sender."""
        eth = self.w.w3.eth
        for number in range(self.scanned + 1, eth.block_number + 1):
            for tx in eth.get_block(number, full_transactions=True)["transactions"]:
                receipt = eth.get_transaction_receipt(tx["hash"])
                fee = int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])
                self.fees[tx["from"]] = self.fees.get(tx["from"], 0) + fee
        self.scanned = eth.block_number

    def holdings(self) -> int:
        w = self.w
        return sum(w.balance(a) for a in self.accounts) + sum(w.balance(c) for c in self.contracts)

    def value_of(self, wallet: str) -> int:
        w = self.w
        value = w.balance(wallet) + self.fees.get(wallet, 0)
        value += int(w.call(w.disputes.functions.creditWei(wallet)))
        value += int(w.call(w.court.functions.creditWei(wallet)))
        for node in self.nodes_of[wallet]:
            value += int(w.call(w.registry.functions.bondOf(node))[1])
        if wallet in self.juror_of:
            value += int(w.call(w.court.functions.jurors(self.juror_of[wallet]))[1])
        return value

    def check_values(self, wallets: list[str]) -> None:
        self.scan_fees()
        for wallet in wallets:
            value = self.value_of(wallet)
            assert value >= self.value[wallet], (
                f"honest wallet {wallet} lost {self.value[wallet] - value} wei"
            )
            self.value[wallet] = value

    # ------------------------------------------------------------ helpers
    def times(self, epoch: int) -> tuple[int, int, int, int]:
        return self.w.epoch_times(self.cast.run, epoch)

    def attempt(self, fn: object, sender: str, value: int = 0) -> bool:
        """A colluder's transaction: it may revert, which changes nothing but its gas."""
        try:
            self.w.tx(fn, sender, value)
        except ContractRevert:
            return False
        return True

    def honest_claims(self) -> None:
        """The honest relays claim every settled epoch at once (as a node's auto-claim does)."""
        w = self.w
        for cert in self.certs:
            settles_at = self.times(cert.epoch)[3]
            if not settles_at < w.now() + 1 < settles_at + CLAIM_PERIOD_S:
                continue
            for relay in self.cast.honest:
                key = (cert.epoch, relay.address)
                if key in self.claimed or cert.tree.worker_range(relay.address) is None:
                    continue
                w.claim(cert.ref, cert.tree, relay, self.wallet_of[relay.address])  # never reverts
                self.claimed.add(key)

    def open_certs(self) -> list[Certificate]:
        """Certificates whose epoch has not settled: their hops may still be disputed."""
        return [c for c in self.certs if self.w.now() + 5 < self.times(c.epoch)[3]]

    # ------------------------------------------------------------ rules
    @rule(
        data=st.data(),
        microbatches=st.integers(1, 3),
        padding=st.integers(0, 3),
    )
    def sponsor_certifies(self, data: st.DataObject, microbatches: int, padding: int) -> None:
        """D certifies the next epoch whose window is still open: the honest relays' hops of
        the microbatches routed through them, and ``padding`` made-up hops of X countersigned
        by Y."""
        w, cast = self.w, self.cast
        epoch = self.next_epoch
        while w.now() + 5 >= self.times(epoch)[2]:
            epoch += 1
        self.next_epoch = epoch + 1
        relays = [*cast.honest, *cast.colluding]
        hops: list[SignedReceipt] = []
        for m in range(microbatches):
            route = data.draw(st.permutations(relays))[:2]
            hops += w.pipeline_hops(cast.run, epoch, cast.data, route, [m])
        x, y = cast.colluding
        for m in range(padding):
            receipt = w.receipt(cast.run, epoch, cast.data, x, y, 100 + m)
            hops.append(w.signed(receipt, x, y))
        tree = w.certificate_tree(hops)
        w.to_submission(cast.run, epoch)
        ref = tree.cert_ref(cast.run, epoch, cast.data.address)
        if self.attempt(w.submit_fn(ref), w.sponsor):
            self.certs.append(Certificate(epoch, ref, tree))

    @initialize(data=st.data(), microbatches=st.integers(1, 3))
    def first_epoch(self, data: st.DataObject, microbatches: int) -> None:
        self.sponsor_certifies(data, microbatches, 0)

    @precondition(lambda self: bool(self.open_certs()))
    @rule(data=st.data(), abandon=st.booleans(), answers=st.booleans())
    def frivolous_tensor_dispute(self, data: st.DataObject, abandon: bool, answers: bool) -> None:
        """A colluder disputes an honest relay's hop; the jury re-executes and rules RIGHT, or
        the challenger abandons the case. Either way the bond goes to the relay's wallet."""
        w = self.w
        cert = data.draw(st.sampled_from(self.open_certs()))
        honest_addresses = {k.address for k in self.cast.honest}
        indices = [
            i for i, e in enumerate(cert.tree.entries) if e.receipt.worker in honest_addresses
        ]
        if not indices:
            return
        index = data.draw(st.sampled_from(indices))
        entry = cert.tree.entries[index]
        proof = fraud_proofs.wrong_tensor(cert.ref, cert.tree.leaf_proof(index), entry)
        challenger = data.draw(st.sampled_from(self.colluders))
        try:
            _, case_id = open_case(w, proof, challenger)
        except ContractRevert:  # this challenger disputed the receipt already
            return
        if answers:
            answer(w, case_id, self.wallet_of[entry.receipt.worker], os.urandom(32))
        if abandon:
            opened_at = int(w.call(w.court.functions.getCase(case_id))[2])
            mine_to(w, opened_at + 2 * phase_blocks(w) + 1)
        else:
            reveal_salt(w, case_id, proof, challenger)
            draw(w, case_id)
            vote(w, case_id, self.cast.jurors, honest(RIGHT))
        execute(w, case_id)
        self.check_values(self.juror_wallets)

    @rule(data=st.data())
    def colluder_equivocates_and_reports_itself(self, data: st.DataObject) -> None:
        """X or Y signs two versions of one hop and a colluding wallet proves it (commit, then
        reveal): the bounty is the colluders' own stake, 95 % of it burned."""
        w, cast = self.w, self.cast
        signer = data.draw(st.sampled_from(cast.colluding))
        other = cast.colluding[1] if signer == cast.colluding[0] else cast.colluding[0]
        epoch = max(0, (w.now() - self.times(0)[0]) // (self.times(1)[0] - self.times(0)[0]))
        first = w.receipt(cast.run, epoch, cast.data, signer, other, 500)
        second = w.receipt(
            cast.run, epoch, cast.data, signer, other, 500, outputDigest=b"\x01" * 32
        )
        proof = w.equivocation(signer, first, second)
        challenger = data.draw(st.sampled_from(self.colluders))
        salt = w.commit(proof, challenger)
        self.attempt(w.reveal_fn(proof, salt, challenger), challenger)

    @precondition(lambda self: bool(self.certs))
    @rule(data=st.data())
    def colluder_tries_to_frame_an_honest_relay(self, data: st.DataObject) -> None:
        """Two of an honest relay's published receipts, put to the chain as an equivocation by
        a colluder: it must revert."""
        w = self.w
        cert = data.draw(st.sampled_from(self.certs))
        relay = data.draw(st.sampled_from(self.cast.honest))
        mine = [e for e in cert.tree.entries if e.receipt.worker == relay.address]
        if len(mine) < 2:
            return
        a, b = data.draw(st.lists(st.sampled_from(mine), min_size=2, max_size=2, unique=True))
        proof = fraud_proofs.equivocation(
            relay.address, a.receipt, a.worker_signature, b.receipt, b.worker_signature
        )
        challenger = data.draw(st.sampled_from(self.colluders))
        salt = w.commit(proof, challenger)
        assert not self.attempt(w.reveal_fn(proof, salt, challenger), challenger)

    @precondition(lambda self: bool(self.certs))
    @rule(data=st.data())
    def colluder_claims(self, data: st.DataObject) -> None:
        cert = data.draw(st.sampled_from(self.certs))
        node = data.draw(st.sampled_from(self.cast.colluding))
        if cert.tree.worker_range(node.address) is not None:
            self.attempt(self.w.claim_fn(cert.ref, cert.tree, node), self.wallet_of[node.address])

    @rule(data=st.data())
    def colluder_moves_money(self, data: st.DataObject) -> None:
        """Bounties, credits, stakes, closed epochs: whatever a colluder can pull."""
        w = self.w
        wallet = data.draw(st.sampled_from(self.colluders))
        node = data.draw(st.sampled_from(self.cast.colluding))
        action = data.draw(
            st.sampled_from(["award", "credit", "court credit", "unstake", "withdraw", "close"])
        )
        if action == "award":
            self.attempt(w.disputes.functions.awardBounty(node.address), wallet)
        elif action == "credit":
            self.attempt(w.disputes.functions.withdrawCredit(), wallet)
        elif action == "court credit":
            self.attempt(w.court.functions.withdrawCredit(), wallet)
        elif action == "unstake":
            self.attempt(w.registry.functions.requestUnstake(node.address), wallet)
        elif action == "withdraw":
            self.attempt(w.registry.functions.withdrawStake(node.address), wallet)
        elif self.certs:
            epoch = data.draw(st.sampled_from(self.certs)).epoch
            self.attempt(w.ledger.functions.closeEpoch(self.cast.run, epoch), wallet)

    @rule(data=st.data())
    def honest_wallet_withdraws(self, data: st.DataObject) -> None:
        w = self.w
        wallet = data.draw(st.sampled_from(self.honest_wallets))
        for contract in (w.disputes, w.court):
            if int(w.call(contract.functions.creditWei(wallet))):
                w.tx(contract.functions.withdrawCredit(), wallet)
        self.check_values([wallet])

    @rule(step=st.sampled_from([300, 1_500, 4_000, CLAIM_PERIOD_S]))
    def time_passes(self, step: int) -> None:
        w = self.w
        if step == CLAIM_PERIOD_S and self.certs:  # the honest claim before a long absence
            w.travel_to(max(w.now() + 1, max(self.times(c.epoch)[3] for c in self.certs) + 1))
        self.honest_claims()
        w.travel_to(w.now() + step)
        self.honest_claims()

    # ------------------------------------------------------------ invariants
    @invariant()
    def no_honest_value_falls_and_ether_is_conserved(self) -> None:
        w = self.w
        self.scan_fees()
        self.check_values(self.relay_wallets)
        assert self.holdings() + sum(self.fees.values()) == self.total
        assert w.balance(w.registry.address) == w.call(w.registry.functions.totalStakedWei())
        run = w.call(w.ledger.functions.getRun(self.cast.run))
        open_reserved = 0
        for epoch in {c.epoch for c in self.certs}:
            book = w.call(w.ledger.functions.epochBook(self.cast.run, epoch))
            if not book[5]:
                open_reserved += int(book[0]) - int(book[4])
        burned = int(w.call(w.ledger.functions.burnedWei()))
        assert w.balance(w.ledger.address) == int(run[5]) + open_reserved + burned


def run_collusion(world: World, examples: int, steps: int) -> None:
    run_on_own_thread(lambda: CollusionMachine(world), examples, steps)


class Script:
    """Stands in for hypothesis' data object in a written schedule: each draw returns the next
    pick, or applies it to the strategy (``first``: a sampled_from's first element)."""

    def __init__(self, *picks: Any) -> None:
        self.picks = list(picks)

    def draw(self, strategy: Any) -> Any:
        pick = self.picks.pop(0)
        return pick(strategy) if callable(pick) else pick


def first(strategy: Any) -> Any:
    return strategy.elements[0]


def test_one_schedule_of_every_colluding_action(world: World) -> None:
    """Every rule once, in an order that makes each bite: the honest relays end up with both
    frivolous disputes' bonds and both epochs' pay, the colluders with a slashed relay."""
    m = CollusionMachine(world)
    w, check = world, m.no_honest_value_falls_and_ether_is_conserved
    (h1, h2), (x, y) = m.cast.honest, m.cast.colluding
    steps: list[Callable[[], None]] = [
        lambda: m.first_epoch(Script([h1, h2], [x, h1]), 2),
        lambda: m.sponsor_certifies(Script([h2, y], [h1, x]), 2, 3),  # padded
        lambda: m.frivolous_tensor_dispute(Script(first, first, w.attacker), False, True),
        lambda: m.frivolous_tensor_dispute(Script(first, first, w.sponsor), True, False),
        lambda: m.colluder_equivocates_and_reports_itself(Script(x, w.accomplice)),
        lambda: m.colluder_tries_to_frame_an_honest_relay(
            Script(
                m.certs[0],
                h1,
                [e for e in m.certs[0].tree.entries if e.receipt.worker == h1.address][:2],
                w.stranger,
            )
        ),
        lambda: m.time_passes(4_000),
        lambda: m.colluder_moves_money(Script(w.stranger, x, "award")),
        lambda: m.colluder_claims(Script(m.certs[1], x)),
        lambda: m.honest_wallet_withdraws(Script(w.wallet(0))),
        lambda: m.honest_wallet_withdraws(Script(m.cast.jurors[0].wallet)),
        lambda: m.time_passes(CLAIM_PERIOD_S),
        lambda: m.colluder_moves_money(Script(w.stranger, x, "close", m.certs[0])),
    ]
    check()
    start = sum(m.value[wallet] for wallet in m.relay_wallets)
    for step in steps:
        step()
        check()
    assert len(m.certs) == 2 and int(w.call(w.registry.functions.bondOf(x.address))[2]) == 4
    assert {(c.epoch, h.address) for c in m.certs for h in (h1, h2)} <= m.claimed
    assert w.call(w.ledger.functions.epochBook(m.cast.run, 0))[5]  # closed
    # Both bonds (0.1 ETH each) and every honest hop's pay reached the relays' wallets.
    honest_units = sum(
        e.receipt.units
        for c in m.certs
        for e in c.tree.entries
        if e.receipt.worker in (h1.address, h2.address)
    )
    paid = int(w.call(w.ledger.functions.payOf(m.cast.run, honest_units)))
    assert sum(m.value[wallet] for wallet in m.relay_wallets) - start == 2 * 10**17 + paid


def test_colluders_never_lower_an_honest_balance_and_ether_is_conserved(world: World) -> None:
    run_collusion(world, examples=2, steps=6)


@pytest.mark.slow
def test_colluders_never_lower_an_honest_balance_and_ether_is_conserved_deeply(
    world: World,
) -> None:
    run_collusion(world, examples=40, steps=25)
