"""Every revert path of the registry and the run book, by custom error name and arguments.
(Fraud-proof, index-challenge and reward reverts live with their features.)"""

from __future__ import annotations

from typing import Any

import pytest
from eth_utils.crypto import keccak

from contracts.bindings import ContractRevert, deploy_contract
from contracts.encoding import sign_binding
from tests.contracts.world import ETH, WINDOW_S, NodeKey, World, default_capacity, reverts

ACTIVE, UNBONDING = 1, 2
ZERO = "0x" + "00" * 20
SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def register_fn(w: World, key: NodeKey, wallet: str, **kw: Any) -> Any:
    peer_id = kw.get("peer_id", key.peer_id)
    signature = kw.get("signature") or sign_binding(
        wallet, peer_id, key.private_key, w.registry_domain
    )
    node = kw.get("node", key.address)
    return w.registry.functions.registerNode(
        node, peer_id, kw.get("capacity", default_capacity()), signature
    )


def test_register_reverts(world: World) -> None:
    w = world
    a = w.register("a", w.wallet(0))
    fresh = w.key("fresh")
    reverts(
        w,
        register_fn(w, a, w.wallet(0)),
        w.wallet(0),
        "NodeAlreadyRegistered",
        a.address,
        value=ETH,
    )
    reverts(w, register_fn(w, fresh, w.wallet(0), node=ZERO), w.wallet(0), "ZeroAddress", value=ETH)
    reverts(
        w,
        register_fn(w, fresh, w.wallet(0), peer_id=b""),
        w.wallet(0),
        "PeerIdLengthInvalid",
        0,
        128,
        value=ETH,
    )
    long_id = b"\x01" * 129
    reverts(
        w,
        register_fn(w, fresh, w.wallet(0), peer_id=long_id),
        w.wallet(0),
        "PeerIdLengthInvalid",
        129,
        128,
        value=ETH,
    )
    taken = register_fn(w, fresh, w.wallet(0), peer_id=a.peer_id)
    reverts(w, taken, w.wallet(0), "PeerIdTaken", keccak(a.peer_id), a.address, value=ETH)
    for capacity in [
        ("", 1, 1, 1),
        ("x" * 65, 1, 1, 1),
        ("GPU", 0, 1, 1),
        ("GPU", 1, 0, 1),
        ("GPU", 1, 1, 0),
    ]:
        reverts(
            w,
            register_fn(w, fresh, w.wallet(0), capacity=capacity),
            w.wallet(0),
            "InvalidCapacity",
            value=ETH,
        )
    reverts(
        w,
        register_fn(w, fresh, w.wallet(0)),
        w.wallet(0),
        "InsufficientStake",
        fresh.address,
        ETH - 1,
        ETH,
        value=ETH - 1,
    )
    # A binding signed for another wallet does not bind this one.
    other_wallet_sig = sign_binding(
        w.wallet(1), fresh.peer_id, fresh.private_key, w.registry_domain
    )
    fn = register_fn(w, fresh, w.wallet(0), signature=other_wallet_sig)
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(fn, w.wallet(0), ETH)
    # The signer recovered over this wallet's binding is some unrelated address.
    assert excinfo.value.name == "BadBindingSignature" and excinfo.value.args[0] == fresh.address
    assert excinfo.value.args[1] not in (fresh.address, ZERO)


def test_register_rejects_malformed_binding_signatures(world: World) -> None:
    w = world
    key = w.key("fresh")
    good = sign_binding(w.wallet(0), key.peer_id, key.private_key, w.registry_domain)
    high_s = (SECP256K1_ORDER - int.from_bytes(good[32:64], "big")).to_bytes(32, "big")
    cases = [
        (good[:64], "ECDSAInvalidSignatureLength", (64,)),
        (good[:32] + high_s + bytes([55 - good[64]]), "ECDSAInvalidSignatureS", (high_s,)),
        (b"\x00" * 64 + b"\x1b", "ECDSAInvalidSignature", ()),
    ]
    for signature, error, args in cases:
        fn = register_fn(w, key, w.wallet(0), signature=signature)
        reverts(w, fn, w.wallet(0), error, *args, value=ETH)


def test_stake_and_capacity_reverts(world: World) -> None:
    w = world
    a = w.register("a", w.wallet(0))
    ghost = w.key("ghost").address
    reverts(w, w.registry.functions.addStake(ghost), w.wallet(0), "UnknownNode", ghost, value=1)
    reverts(
        w,
        w.registry.functions.addStake(a.address),
        w.wallet(1),
        "NotNodeWallet",
        a.address,
        w.wallet(1),
        value=1,
    )
    reverts(w, w.registry.functions.addStake(a.address), w.wallet(0), "ZeroAmount")
    reverts(
        w,
        w.registry.functions.withdrawStake(a.address),
        w.wallet(0),
        "NodeNotUnbonding",
        a.address,
        ACTIVE,
    )
    bad_capacity = ("GPU", 0, 1, 1)
    reverts(
        w,
        w.registry.functions.updateCapacity(a.address, bad_capacity),
        w.wallet(0),
        "InvalidCapacity",
    )
    w.tx(w.registry.functions.requestUnstake(a.address), w.wallet(0))
    unlock_at = w.registry.functions.getNode(a.address).call()[3]
    reverts(
        w,
        w.registry.functions.addStake(a.address),
        w.wallet(0),
        "NodeNotActive",
        a.address,
        UNBONDING,
        value=1,
    )
    reverts(
        w,
        w.registry.functions.updateCapacity(a.address, default_capacity()),
        w.wallet(0),
        "NodeNotActive",
        a.address,
        UNBONDING,
    )
    reverts(
        w,
        w.registry.functions.requestUnstake(a.address),
        w.wallet(0),
        "NodeNotActive",
        a.address,
        UNBONDING,
    )
    reverts(
        w,
        w.registry.functions.withdrawStake(a.address),
        w.wallet(0),
        "StakeStillLocked",
        a.address,
        unlock_at,
        w.now() + 1,
    )
    reverts(w, w.registry.functions.slash(a.address), w.stranger, "NotLedger", w.stranger)
    with pytest.raises(Exception, match="PageTooLarge"):
        w.call(w.registry.functions.nodesOf(w.wallet(0), 0, 101))


def test_registry_wiring_reverts(world: World) -> None:
    w = world
    reverts(
        w,
        w.registry.functions.setLedger(w.stranger),
        w.deployer,
        "LedgerAlreadySet",
        w.ledger.address,
    )
    fresh = deploy_contract(w.w3, "NodeRegistry", w.deployer, ETH, 100, w.deployer)
    reverts(w, fresh.functions.setLedger(ZERO), w.deployer, "ZeroAddress")
    with pytest.raises(ContractRevert) as excinfo:
        deploy_contract(w.w3, "NodeRegistry", w.deployer, 0, 100, w.deployer)
    assert excinfo.value.name == "ZeroAmount"
    with pytest.raises(ContractRevert) as excinfo:
        deploy_contract(w.w3, "WorkLedger", w.deployer, w.registry.address, 10, 1, 10_001)
    assert (excinfo.value.name, excinfo.value.args) == ("BountyTooLarge", (10_001,))
    with pytest.raises(ContractRevert) as excinfo:
        deploy_contract(w.w3, "WorkLedger", w.deployer, w.registry.address, 10, 2**96, 100)
    assert (excinfo.value.name, excinfo.value.args) == ("WrongBond", (2**96, 0))
    # The ledger takes ETH only from the registry (slashed stake).
    reverts(w, _send_eth(w), w.stranger, "UnexpectedPayment", w.stranger, value=1)


def _send_eth(w: World) -> Any:
    class PlainTransfer:
        """A ContractFunction look-alike for a bare ETH transfer."""

        def transact(self, params: Any) -> Any:
            return w.w3.eth.send_transaction({**params, "to": w.ledger.address})

        def call(self, params: Any, block_identifier: Any = "latest") -> Any:
            return w.w3.eth.call({**params, "to": w.ledger.address}, block_identifier)

    return PlainTransfer()


UNBONDING_S = 10_000  # conftest's registry
REVEAL_S = 600


@pytest.mark.parametrize(
    ("overrides", "error", "args"),
    [
        ({"stageCount": 0}, "StageCountOutOfRange", (0, 1024)),
        ({"stageCount": 1025}, "StageCountOutOfRange", (1025, 1024)),
        ({"epochLengthS": 0}, "EpochLengthOutOfRange", (0, 30 * 86400)),
        ({"challengeWindowS": 0}, "ZeroChallengeWindow", ()),
        ({"unitsPerHop": 0}, "ZeroUnitsPerHop", ()),
        ({"rewardPerEpochWei": 0}, "ZeroRewardPerEpoch", ()),
        ({"minStakeWei": ETH - 1}, "MinStakeBelowRegistry", (ETH - 1, ETH)),
        (
            {"epochLengthS": 4_000},
            "WindowsExceedUnbonding",
            (8_000 + WINDOW_S + REVEAL_S, UNBONDING_S),
        ),
    ],
)
def test_open_run_validates_its_config(
    world: World, overrides: dict[str, int], error: str, args: tuple[Any, ...]
) -> None:
    reverts(
        world,
        world.ledger.functions.openRun(world.run_config(**overrides)),
        world.sponsor,
        error,
        *args,
    )


def test_run_lifecycle_reverts(world: World) -> None:
    w = world
    ledger = w.ledger.functions
    run = w.open_run()
    reverts(w, ledger.fundRun(99), w.sponsor, "UnknownRun", 99, value=1)
    reverts(w, ledger.fundRun(run), w.stranger, "NotSponsor", run, w.stranger, value=1)
    reverts(w, ledger.fundRun(run), w.sponsor, "ZeroAmount")
    reverts(w, ledger.withdrawRefund(run), w.sponsor, "RunNotClosed", run)
    w.tx(ledger.closeRun(run), w.sponsor)
    refundable_at = ledger.refundableAt(run).call()
    assert refundable_at == w.epoch_times(run, 0)[1]
    reverts(w, ledger.closeRun(run), w.sponsor, "RunIsClosed", run)
    reverts(w, ledger.fundRun(run), w.sponsor, "RunIsClosed", run, value=1)
    reverts(
        w, ledger.withdrawRefund(run), w.sponsor, "RefundNotYet", run, refundable_at, w.now() + 1
    )
    a = w.register("a", w.wallet(0))
    reverts(w, ledger.joinRun(run, a.address), w.wallet(0), "RunIsClosed", run)
    w.travel_to(refundable_at)
    w.tx(ledger.withdrawRefund(run), w.sponsor)
    reverts(w, ledger.withdrawRefund(run), w.sponsor, "NothingToWithdraw", w.sponsor)
    reverts(w, ledger.withdrawCredit(), w.stranger, "NothingToWithdraw", w.stranger)


def test_membership_reverts(world: World) -> None:
    w = world
    ledger = w.ledger.functions
    run = w.open_run(minStakeWei=3 * ETH)
    a = w.register("a", w.wallet(0), 2 * ETH)
    b = w.register("b", w.wallet(1), 3 * ETH)
    reverts(
        w,
        ledger.joinRun(run, a.address),
        w.wallet(0),
        "StakeBelowRunMinimum",
        a.address,
        2 * ETH,
        3 * ETH,
    )
    reverts(w, ledger.joinRun(run, b.address), w.wallet(0), "NotNodeWallet", b.address, w.wallet(0))
    reverts(w, ledger.joinRun(99, b.address), w.wallet(1), "UnknownRun", 99)
    w.join(run, b, w.wallet(1))
    reverts(w, ledger.joinRun(run, b.address), w.wallet(1), "AlreadyMember", run, b.address)
    reverts(
        w, ledger.leaveRun(run, b.address), w.wallet(0), "NotNodeWallet", b.address, w.wallet(0)
    )
    w.tx(ledger.leaveRun(run, b.address), w.wallet(1))
    reverts(w, ledger.leaveRun(run, b.address), w.wallet(1), "NotMember", run, b.address)
    w.tx(w.registry.functions.requestUnstake(b.address), w.wallet(1))
    reverts(w, ledger.joinRun(run, b.address), w.wallet(1), "NodeNotActive", b.address)
    with pytest.raises(Exception, match="PageTooLarge"):
        w.call(ledger.activeNodesOfRun(run, 0, 101))


def test_submission_reverts(pair: Any) -> None:
    w, run, a, b = pair
    ledger = w.ledger.functions
    tree = w.honest_tree(run, 0, a, b, count=2)  # 100 + 200 units
    claim = tree.claim(run, 0, a.address)

    def submit(
        epoch: int = 0,
        count: int = 2,
        units: int = 300,
        sender: str = w.wallet(0),
        node: str = a.address,
    ) -> Any:
        return ledger.submitEpochRoot(run, epoch, node, claim.root, count, units), sender

    opens_at, closes_at, _, _ = w.epoch_times(run, 0)
    reverts(w, *submit(), "SubmissionClosed", run, 0, opens_at, closes_at)
    w.to_submission(run, 0)
    reverts(w, *submit(count=0, units=0), "EmptyClaim")
    reverts(w, *submit(units=199), "UnitsOutOfRange", 199, 200, 400)
    reverts(w, *submit(units=401), "UnitsOutOfRange", 401, 200, 400)
    reverts(w, *submit(sender=w.wallet(1)), "NotNodeWallet", a.address, w.wallet(1))
    outsider = w.register("outsider", w.wallet(2))
    reverts(
        w, *submit(sender=w.wallet(2), node=outsider.address), "NotRunMember", run, outsider.address
    )
    w.tx(*submit())
    reverts(w, *submit(), "ClaimAlreadySubmitted", run, 0, a.address)
    # A node that started unbonding (here during epoch 1) did not work in epoch 2 while active.
    w.tx(w.registry.functions.requestUnstake(b.address), w.wallet(1))
    w.travel_to(w.epoch_times(run, 2)[0])
    reverts(w, *submit(epoch=2, sender=w.wallet(1), node=b.address), "NodeNotBonded", b.address)
    reverts(w, *submit(), "SubmissionClosed", run, 0, opens_at, closes_at)
    w.tx(ledger.closeRun(run), w.sponsor)
    last_epoch = w.ledger.functions.getRun(run).call()[9]
    reverts(w, *submit(epoch=last_epoch + 1), "EpochAfterClose", run, last_epoch + 1, last_epoch)
