"""A contract wallet that re-enters the contract paying it: every re-entry is refused by the
guard, and the attacker is paid exactly once."""

from __future__ import annotations

from typing import Any

import pytest
from eth_tester.exceptions import TransactionFailed

from contracts.bindings import ContractRevert, all_errors_abi, decode_revert, deploy_contract
from contracts.encoding import ClaimRef, sign_binding
from tests.contracts.world import ETH, World, default_capacity, reverts


def attacker_node(w: World, run: int | None = None) -> tuple[Any, Any]:
    """A ReentrantWallet owning node 'evil' (stake 2 ETH), joined to ``run`` if given."""
    wallet = deploy_contract(w.w3, "ReentrantWallet", w.stranger)
    key = w.key("evil")
    signature = sign_binding(wallet.address, key.peer_id, key.private_key, w.registry_domain)
    register = w.registry.encode_abi(
        "registerNode", args=[key.address, key.peer_id, default_capacity(), signature]
    )
    w.tx(wallet.functions.execute(w.registry.address, register), w.stranger, 2 * ETH)
    if run is not None:
        join = w.ledger.encode_abi("joinRun", args=[run, key.address])
        w.tx(wallet.functions.execute(w.ledger.address, join), w.stranger)
    return wallet, key


def assert_paid_once_and_reentry_refused(wallet: Any) -> None:
    assert wallet.functions.paymentsReceived().call() == 1
    assert wallet.functions.reentryAttempts().call() == 1
    assert wallet.functions.reentrySuccesses().call() == 0
    refused = decode_revert(
        TransactionFailed(bytes(wallet.functions.lastReentryRevert().call())), all_errors_abi()
    )
    assert (refused.name, refused.args) == ("ReentrancyGuardReentrantCall", ())


def test_reentering_withdraw_stake_is_refused(world: World) -> None:
    w = world
    wallet, key = attacker_node(w)
    unstake = w.registry.encode_abi("requestUnstake", args=[key.address])
    w.tx(wallet.functions.execute(w.registry.address, unstake), w.stranger)
    w.travel_to(w.registry.functions.getNode(key.address).call()[3])
    withdraw = w.registry.encode_abi("withdrawStake", args=[key.address])
    w.tx(wallet.functions.arm(w.registry.address, withdraw), w.stranger)
    w.tx(wallet.functions.execute(w.registry.address, withdraw), w.stranger)
    assert_paid_once_and_reentry_refused(wallet)
    assert w.balance(wallet.address) == 2 * ETH
    assert w.registry.functions.totalStakedWei().call() == w.balance(w.registry.address) == 0


def test_reentering_claim_reward_is_refused(world: World) -> None:
    w = world
    run = w.open_run()
    wallet, evil = attacker_node(w, run)
    peer = w.register("peer", w.wallet(0))
    w.join(run, peer, w.wallet(0))
    tree = w.honest_tree(run, 0, evil, peer, count=2)
    w.to_submission(run, 0)
    claim: ClaimRef = tree.claim(run, 0, evil.address)
    submit = w.ledger.encode_abi(
        "submitEpochRoot", args=[run, 0, evil.address, claim.root, claim.count, claim.units]
    )
    w.tx(wallet.functions.execute(w.ledger.address, submit), w.stranger)
    w.to_settled(run, 0)
    claim_call = w.ledger.encode_abi("claimReward", args=[claim.as_tuple()])
    w.tx(wallet.functions.arm(w.ledger.address, claim_call), w.stranger)
    w.tx(wallet.functions.execute(w.ledger.address, claim_call), w.stranger)
    assert_paid_once_and_reentry_refused(wallet)
    assert w.balance(wallet.address) == 3 * ETH  # the whole epoch budget, once


def test_reentering_withdraw_credit_is_refused_and_a_refusing_wallet_gets_transfer_failed(
    world: World,
) -> None:
    w = world
    run = w.open_run()
    wallet, evil = attacker_node(w, run)
    peer = w.register("peer", w.wallet(0))
    w.join(run, peer, w.wallet(0))
    # The attacker earns a bounty honestly: peer claims evil's work.
    stolen = w.honest_tree(run, 0, evil, peer, count=1)
    w.to_submission(run, 0)
    claim = stolen.claim(run, 0, peer.address)
    w.submit(claim, w.wallet(0))
    prove = w.ledger.encode_abi(
        "proveWrongWorker", args=[claim.as_tuple(), stolen.leaf_proof(0).as_tuple()]
    )
    w.tx(wallet.functions.execute(w.ledger.address, prove), w.stranger)
    bounty = w.ledger.functions.creditWei(wallet.address).call()
    assert bounty == ETH
    withdraw = w.ledger.encode_abi("withdrawCredit", args=[])
    w.tx(wallet.functions.setRejecting(True), w.stranger)
    forwarded = wallet.functions.execute(w.ledger.address, withdraw)
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(forwarded, w.stranger)
    # The wallet's ForwardFailed(bytes) carries the ledger's own revert, decoded the same way.
    assert excinfo.value.name == "ForwardFailed"
    decoded = decode_revert(TransactionFailed(excinfo.value.args[0]), w.ledger.abi)
    assert (decoded.name, decoded.args) == ("TransferFailed", (wallet.address, ETH))
    w.tx(wallet.functions.setRejecting(False), w.stranger)
    w.tx(wallet.functions.arm(w.ledger.address, withdraw), w.stranger)
    w.tx(forwarded, w.stranger)
    assert_paid_once_and_reentry_refused(wallet)
    reverts(w, w.ledger.functions.withdrawCredit(), w.stranger, "NothingToWithdraw", w.stranger)
