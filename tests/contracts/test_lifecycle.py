"""The whole story on a real EVM: register, join, submit roots, settle, claim rewards, unstake,
withdraw, close the run and refund the sponsor; every value movement is checked in wei."""

from __future__ import annotations

from contracts.bindings import find_claim
from tests.contracts.world import ETH, REWARD_PER_EPOCH, World

ACTIVE, UNBONDING, WITHDRAWN, SLASHED = 1, 2, 3, 4


def test_full_lifecycle(world: World) -> None:
    w = world
    a = w.register("a", w.wallet(0), 2 * ETH)
    b = w.register("b", w.wallet(1), 3 * ETH)
    assert w.registry.functions.totalStakedWei().call() == 5 * ETH
    assert w.balance(w.registry.address) == 5 * ETH

    run = w.open_run(funding_wei=5 * ETH)
    w.join(run, a, w.wallet(0))
    w.join(run, b, w.wallet(1))
    assert w.ledger.functions.activeNodesOfRun(run, 0, 10).call() == [a.address, b.address]

    tree_a = w.honest_tree(run, 0, a, b, count=6)  # 3 forward + 3 backward: 900 units
    tree_b = w.honest_tree(run, 0, b, a, count=3)  # 2 forward + 1 backward: 400 units
    assert (tree_a.units, tree_b.units) == (900, 400)
    w.to_submission(run, 0)
    w.submit(tree_a.claim(run, 0, a.address), w.wallet(0))
    w.submit(tree_b.claim(run, 0, b.address), w.wallet(1))
    assert find_claim(w.ledger, run, 0, a.address) == tree_a.claim(run, 0, a.address)
    book = w.ledger.functions.epochBook(run, 0).call()
    assert book == (1300, REWARD_PER_EPOCH, True)
    assert w.ledger.functions.getRun(run).call()[5] == 5 * ETH - REWARD_PER_EPOCH

    w.to_settled(run, 0)
    paid = {}
    for key, tree, wallet in ((a, tree_a, w.wallet(0)), (b, tree_b, w.wallet(1))):
        before = w.balance(wallet)
        receipt = w.tx(
            w.ledger.functions.claimReward(tree.claim(run, 0, key.address).as_tuple()), wallet
        )
        (event,) = w.ledger.events.RewardClaimed().process_receipt(receipt)
        paid[key.address] = event["args"]["amountWei"]
        gas_cost = receipt["gasUsed"] * receipt["effectiveGasPrice"]
        assert w.balance(wallet) == before + paid[key.address] - gas_cost
    assert paid[a.address] == REWARD_PER_EPOCH * 900 // 1300
    # The last claimant takes the rounding dust: the budget is paid exactly.
    assert sum(paid.values()) == REWARD_PER_EPOCH
    assert w.ledger.functions.epochBook(run, 0).call() == (0, 0, True)

    # Unstake: out of the active set at once, stake back after the delay.
    w.tx(w.registry.functions.requestUnstake(a.address), w.wallet(0))
    assert w.ledger.functions.activeNodesOfRun(run, 0, 10).call() == [b.address]
    node = w.registry.functions.getNode(a.address).call()
    assert node[2] == UNBONDING
    w.travel_to(node[3])
    before = w.balance(w.wallet(0))
    receipt = w.tx(w.registry.functions.withdrawStake(a.address), w.wallet(0))
    gas_cost = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert w.balance(w.wallet(0)) == before + 2 * ETH - gas_cost
    assert w.registry.functions.totalStakedWei().call() == 3 * ETH == w.balance(w.registry.address)

    # Close: the epoch in progress is the last; the rest of the pool returns to the sponsor.
    w.tx(w.ledger.functions.closeRun(run), w.sponsor)
    refundable_at = w.ledger.functions.refundableAt(run).call()
    w.travel_to(refundable_at)
    before = w.balance(w.sponsor)
    receipt = w.tx(w.ledger.functions.withdrawRefund(run), w.sponsor)
    gas_cost = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert w.balance(w.sponsor) == before + 2 * ETH - gas_cost
    assert w.balance(w.ledger.address) == 0


def test_several_runs_side_by_side_keep_their_own_funds(world: World) -> None:
    w = world
    a = w.register("a", w.wallet(0))
    b = w.register("b", w.wallet(1))
    first = w.open_run(funding_wei=4 * ETH)
    second = w.open_run(funding_wei=ETH, rewardPerEpochWei=10 * ETH)
    for run in (first, second):
        w.join(run, a, w.wallet(0))
        w.join(run, b, w.wallet(1))
    w.to_submission(first, 0)
    for run in (first, second):
        tree = w.honest_tree(run, 0, a, b, count=2)
        w.submit(tree.claim(run, 0, a.address), w.wallet(0))
    # Each epoch budget is capped by its own run's funds.
    assert w.ledger.functions.epochBook(first, 0).call()[1] == REWARD_PER_EPOCH
    assert w.ledger.functions.epochBook(second, 0).call()[1] == ETH
    assert w.ledger.functions.getRun(second).call()[5] == 0


def test_views_page_wallet_nodes_and_run_members(world: World) -> None:
    w = world
    keys = [w.register(f"n{i}", w.wallet(0)) for i in range(5)]
    assert w.registry.functions.nodeCountOf(w.wallet(0)).call() == 5
    assert w.registry.functions.nodesOf(w.wallet(0), 1, 3).call() == [k.address for k in keys[1:4]]
    assert w.registry.functions.nodesOf(w.wallet(0), 4, 10).call() == [keys[4].address]
    assert w.registry.functions.nodesOf(w.wallet(0), 9, 10).call() == []
    run = w.open_run()
    for key in keys:
        w.join(run, key, w.wallet(0))
    w.tx(w.ledger.functions.leaveRun(run, keys[1].address), w.wallet(0))
    assert w.ledger.functions.memberCount(run).call() == 4
    members = w.ledger.functions.activeNodesOfRun(run, 0, 10).call()
    assert sorted(members) == sorted(k.address for i, k in enumerate(keys) if i != 1)
    assert w.ledger.functions.hasJoined(run, keys[1].address).call()  # past membership stays
    w.tx(w.registry.functions.requestUnstake(keys[0].address), w.wallet(0))
    assert keys[0].address not in w.ledger.functions.activeNodesOfRun(run, 0, 10).call()
    assert len(w.ledger.functions.activeNodesOfRun(run, 0, 2).call()) == 1
    node = w.registry.functions.getNode(keys[2].address).call()
    assert node[0] == w.wallet(0) and node[5] == keys[2].peer_id
    assert tuple(node[6]) == ("RTX 4090", 24_576, 3_600, 4)


def test_capacity_update_and_stake_top_up(world: World) -> None:
    w = world
    a = w.register("a", w.wallet(0), 2 * ETH)
    w.tx(w.registry.functions.updateCapacity(a.address, ("H100", 81_920, 20_000, 8)), w.wallet(0))
    w.tx(w.registry.functions.addStake(a.address), w.wallet(0), ETH)
    node = w.registry.functions.getNode(a.address).call()
    assert node[1] == 3 * ETH and tuple(node[6]) == ("H100", 81_920, 20_000, 8)
    assert w.registry.functions.totalStakedWei().call() == 3 * ETH


def test_unbonding_node_may_still_submit_the_epoch_it_worked_in(world: World) -> None:
    w = world
    a = w.register("a", w.wallet(0))
    b = w.register("b", w.wallet(1))
    run = w.open_run()
    w.join(run, a, w.wallet(0))
    w.join(run, b, w.wallet(1))
    w.tx(w.registry.functions.requestUnstake(a.address), w.wallet(0))  # during epoch 0
    tree = w.honest_tree(run, 0, a, b, count=2)
    w.to_submission(run, 0)
    w.submit(tree.claim(run, 0, a.address), w.wallet(0))
    assert (
        w.ledger.functions.claimCommitment(run, 0, a.address).call()
        == tree.claim(run, 0, a.address).commitment()
    )
