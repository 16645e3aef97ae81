"""Rewards (pro rata, paid once, dust accounted, voided budgets returned) and index challenges
(answered: bond to the node; unanswered: slashed)."""

from __future__ import annotations

from typing import Any

from web3.logs import DISCARD

from contracts.epoch_tree import EpochTree
from tests.contracts.world import ETH, REWARD_PER_EPOCH, NodeKey, World, reverts

BOND = 10**16
UNREVEALED = 6


def submit_both(
    w: World, run: int, a: NodeKey, b: NodeKey, count_a: int, count_b: int
) -> tuple[EpochTree, EpochTree]:
    tree_a = w.honest_tree(run, 0, a, b, count=count_a)
    tree_b = w.honest_tree(run, 0, b, a, count=count_b)
    w.to_submission(run, 0)
    w.submit(tree_a.claim(run, 0, a.address), w.wallet(0))
    w.submit(tree_b.claim(run, 0, b.address), w.wallet(1))
    return tree_a, tree_b


def claim_reward(w: World, tree: EpochTree, run: int, key: NodeKey, wallet: str) -> int:
    receipt = w.tx(
        w.ledger.functions.claimReward(tree.claim(run, 0, key.address).as_tuple()), wallet
    )
    (event,) = w.ledger.events.RewardClaimed().process_receipt(receipt)
    return int(event["args"]["amountWei"])


def test_rewards_are_paid_once_after_settlement_with_dust_to_the_last(pair: Any) -> None:
    w, run, a, b = pair
    tree_a, tree_b = submit_both(w, run, a, b, count_a=1, count_b=2)  # 100 and 300 units
    claim_a = tree_a.claim(run, 0, a.address).as_tuple()
    settles_at = w.epoch_times(run, 0)[3]
    reverts(
        w, w.ledger.functions.claimReward(claim_a), w.wallet(0), "NotSettled", run, 0, settles_at
    )
    w.to_settled(run, 0)
    reverts(
        w,
        w.ledger.functions.claimReward(claim_a),
        w.wallet(1),
        "NotNodeWallet",
        a.address,
        w.wallet(1),
    )
    paid_b = claim_reward(w, tree_b, run, b, w.wallet(1))
    paid_a = claim_reward(w, tree_a, run, a, w.wallet(0))
    assert paid_b == REWARD_PER_EPOCH * 300 // 400
    assert paid_a + paid_b == REWARD_PER_EPOCH
    reverts(
        w, w.ledger.functions.claimReward(claim_a), w.wallet(0), "ClaimNotOpen", run, 0, a.address
    )


def test_indivisible_budget_leaves_no_dust_behind(world: World) -> None:
    w = world
    keys = [w.register(f"n{i}", w.wallet(i % 4)) for i in range(3)]
    run = w.open_run(rewardPerEpochWei=10**18 + 1)  # not divisible by 3 equal shares
    for i, key in enumerate(keys):
        w.join(run, key, w.wallet(i % 4))
    trees = [w.honest_tree(run, 0, key, keys[(i + 1) % 3], count=1) for i, key in enumerate(keys)]
    w.to_submission(run, 0)
    for i, (key, tree) in enumerate(zip(keys, trees, strict=True)):
        w.submit(tree.claim(run, 0, key.address), w.wallet(i % 4))
    w.to_settled(run, 0)
    paid = [
        claim_reward(w, tree, run, key, w.wallet(i % 4))
        for i, (key, tree) in enumerate(zip(keys, trees, strict=True))
    ]
    assert sum(paid) == 10**18 + 1 and max(paid) - min(paid) <= 1
    assert w.ledger.functions.epochBook(run, 0).call() == (0, 0, True)


def test_budget_capped_by_funds_and_returned_when_every_claim_is_voided(pair: Any) -> None:
    w, run, a, b = pair
    stolen = w.honest_tree(run, 0, b, a, count=1)  # a claims b's work
    w.to_submission(run, 0)
    claim = stolen.claim(run, 0, a.address)
    w.submit(claim, w.wallet(0))
    pool = w.ledger.functions.getRun(run).call()[5]
    assert pool == 10 * ETH - REWARD_PER_EPOCH
    w.tx(
        w.ledger.functions.proveWrongWorker(claim.as_tuple(), stolen.leaf_proof(0).as_tuple()),
        w.challenger,
    )
    # The whole budget and half of a's 2 ETH stake flow back to the pool.
    assert w.ledger.functions.getRun(run).call()[5] == 10 * ETH + ETH


def test_answered_index_challenge_pays_the_bond_to_the_node(pair: Any) -> None:
    w, run, a, b = pair
    tree_a, _ = submit_both(w, run, a, b, count_a=3, count_b=1)
    claim = tree_a.claim(run, 0, a.address)
    ledger = w.ledger.functions
    reverts(
        w,
        ledger.openIndexChallenge(claim.as_tuple(), 3),
        w.challenger,
        "IndexOutOfRange",
        3,
        3,
        value=BOND,
    )
    reverts(
        w,
        ledger.openIndexChallenge(claim.as_tuple(), 1),
        w.challenger,
        "WrongBond",
        BOND - 1,
        BOND,
        value=BOND - 1,
    )
    reverts(
        w,
        ledger.revealLeaf(claim.as_tuple(), tree_a.leaf_proof(1).as_tuple()),
        w.wallet(0),
        "NoChallengeOpen",
        1,
    )
    w.tx(ledger.openIndexChallenge(claim.as_tuple(), 1), w.challenger, BOND)
    reverts(
        w,
        ledger.openIndexChallenge(claim.as_tuple(), 1),
        w.stranger,
        "ChallengeAlreadyOpen",
        1,
        value=BOND,
    )
    deadline = ledger.indexChallenge(claim.as_tuple(), 1).call()[1]
    reverts(
        w, ledger.slashUnrevealed(claim.as_tuple(), 1), w.challenger, "RevealNotDue", 1, deadline
    )
    receipt = w.tx(
        ledger.revealLeaf(claim.as_tuple(), tree_a.leaf_proof(1).as_tuple()), w.wallet(0)
    )
    (event,) = w.ledger.events.LeafRevealed().process_receipt(receipt)
    assert tuple(event["args"]["receipt"].values()) == tree_a.entries[1].receipt.as_tuple()
    assert ledger.creditWei(w.wallet(0)).call() == BOND
    assert ledger.openChallenges(run, 0, a.address).call() == 0
    w.to_settled(run, 0)
    assert claim_reward(w, tree_a, run, a, w.wallet(0)) > 0


def test_unanswered_index_challenge_slashes_the_node(pair: Any) -> None:
    w, run, a, b = pair
    tree_a, tree_b = submit_both(w, run, a, b, count_a=2, count_b=2)
    claim = tree_a.claim(run, 0, a.address)
    ledger = w.ledger.functions
    w.tx(ledger.openIndexChallenge(claim.as_tuple(), 0), w.challenger, BOND)
    deadline = ledger.indexChallenge(claim.as_tuple(), 0).call()[1]
    w.travel_to(deadline + 1)
    late = ledger.revealLeaf(claim.as_tuple(), tree_a.leaf_proof(0).as_tuple())
    reverts(w, late, w.wallet(0), "RevealTooLate", 0, deadline)
    # Every deadline falls before the epoch settles; an overdue challenge still blocks the reward.
    w.to_settled(run, 0)
    reverts(
        w, ledger.claimReward(claim.as_tuple()), w.wallet(0), "ChallengesOpen", run, 0, a.address, 1
    )
    receipt = w.tx(ledger.slashUnrevealed(claim.as_tuple(), 0), w.stranger)
    (event,) = w.ledger.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["fraud"] == UNREVEALED and event["args"]["challenger"] == w.challenger
    assert ledger.creditWei(w.challenger).call() == BOND + ETH  # bond back + half of 2 ETH
    # The survivor now takes the whole epoch budget.
    assert claim_reward(w, tree_b, run, b, w.wallet(1)) == REWARD_PER_EPOCH


def test_challenge_on_a_claim_voided_meanwhile_just_returns_the_bond(pair: Any) -> None:
    w, run, a, b = pair
    stolen = w.honest_tree(run, 0, b, a, count=2)
    w.to_submission(run, 0)
    claim = stolen.claim(run, 0, a.address)
    w.submit(claim, w.wallet(0))
    ledger = w.ledger.functions
    w.tx(ledger.openIndexChallenge(claim.as_tuple(), 1), w.stranger, BOND)
    w.tx(ledger.proveWrongWorker(claim.as_tuple(), stolen.leaf_proof(0).as_tuple()), w.challenger)
    w.travel_to(ledger.indexChallenge(claim.as_tuple(), 1).call()[1] + 1)
    receipt = w.tx(ledger.slashUnrevealed(claim.as_tuple(), 1), w.stranger)
    assert len(w.ledger.events.IndexChallengeDropped().process_receipt(receipt)) == 1
    assert ledger.creditWei(w.stranger).call() == BOND
    reverts(w, ledger.slashUnrevealed(claim.as_tuple(), 1), w.stranger, "NoChallengeOpen", 1)


def test_index_challenges_close_with_the_challenge_window(pair: Any) -> None:
    w, run, a, b = pair
    tree_a, _ = submit_both(w, run, a, b, count_a=1, count_b=1)
    claim = tree_a.claim(run, 0, a.address)
    challenge_ends_at = w.epoch_times(run, 0)[2]
    w.travel_to(challenge_ends_at)
    fn = w.ledger.functions.openIndexChallenge(claim.as_tuple(), 0)
    reverts(w, fn, w.challenger, "ChallengePeriodOver", run, 0, challenge_ends_at, value=BOND)
