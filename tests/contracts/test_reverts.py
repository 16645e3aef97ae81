"""Every custom error of NodeRegistry, WorkLedger (with its RunBook) and Disputes, triggered
through the public interface and checked by name and exact arguments; OpenZeppelin's errors in
those ABIs included. Re-entrancy and refused payments (ReentrancyGuardReentrantCall,
TransferFailed) are triggered in ``test_reentrancy.py``. The last test reads the three ABIs and
fails naming any error that no test of this folder names."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eth_tester import EthereumTester, PyEVMBackend
from eth_tester.exceptions import TransactionFailed
from eth_utils.crypto import keccak
from web3 import EthereumTesterProvider, Web3
from web3.exceptions import ContractLogicError

from gwtf.contracts import fraud_proofs
from gwtf.contracts.artifacts import load_artifacts
from gwtf.contracts.bindings import (
    ContractRevert,
    all_errors_abi,
    call,
    decode_revert,
    deploy_contract,
    deploy_suite,
)
from gwtf.contracts.certificate_tree import LeafProof, claim_reward_args
from gwtf.contracts.encoding import (
    CertifiedHop,
    CertRef,
    HopReceipt,
    WorkerSpan,
    binding_digest,
    recover_digest_signer,
    registry_domain,
    sign_binding,
    sign_digest,
    sign_receipt,
)
from tests.contracts.conftest import TEST_PARAMS, Certified, Staffed
from tests.contracts.world import (
    ETH,
    HOP_PRICE,
    TEST_GAS_LIMIT,
    WINDOW_S,
    NodeKey,
    World,
    default_capacity,
    proof_reverts,
    reverts,
)

ZERO = "0x" + "00" * 20
PADDING_WORKER = "0x" + "ff" * 20  # above every worker: the last span
ACTIVE, UNBONDING, WITHDRAWN, SLASHED = 1, 2, 3, 4
SECP256K1_ORDER = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
MAX_EPOCH_LENGTH_S = 30 * 86_400
MAX_BOUNTY_BPS = 1_000
MAX_UNITS_PER_HOP = (2**64 - 1) // 2
DEPLOYED = ("NodeRegistry", "WorkLedger", "Disputes", "Court")
UNBONDING_S = TEST_PARAMS.unbonding_delay_s


# ---------------------------------------------------------------- helpers


def outcome_of(action: Callable[[], Any]) -> tuple[str, tuple[Any, ...]]:
    """The (name, args) of the ContractRevert ``action`` raises; fails if it raises none."""
    with pytest.raises(ContractRevert) as excinfo:
        action()
    return excinfo.value.name, excinfo.value.args


def call_reverts(fn: Any, name: str, *args: Any, sender: str | None = None) -> None:
    """A view (or a simulated transaction) reverts with ``name`` and exactly ``args``."""
    assert outcome_of(lambda: call(fn, sender)) == (name, args)


def deploy_reverts(
    w: World, contract: str, ctor_args: tuple[Any, ...], name: str, *args: Any
) -> None:
    assert outcome_of(lambda: deploy_contract(w.w3, contract, w.deployer, *ctor_args)) == (
        name,
        args,
    )


def register_fn(
    w: World,
    key: NodeKey,
    wallet: str,
    *,
    public_key: bytes | None = None,
    capacity: tuple[Any, ...] | None = None,
    signature: bytes | None = None,
) -> Any:
    if signature is None:
        signature = sign_binding(wallet, key.private_key, w.registry_domain)
    return w.registry.functions.registerNode(
        key.public_key if public_key is None else public_key,
        default_capacity() if capacity is None else capacity,
        signature,
    )


def conflicting(
    w: World, run: int, epoch: int, data: NodeKey, worker: NodeKey, counterparty: NodeKey
) -> tuple[HopReceipt, HopReceipt]:
    """Two receipts of one hop (same hop key) that differ in their output."""
    first = w.receipt(run, epoch, data, worker, counterparty, 0)
    return first, replace(first, outputDigest=keccak(text="another output"))


def equivocation(
    w: World, signer: NodeKey, first: HopReceipt, second: HopReceipt
) -> fraud_proofs.FraudProof:
    """``signer`` signed both receipts."""
    return w.equivocation(signer, first, second)


class PlainTransfer:
    """A ContractFunction look-alike for a bare ETH transfer to ``to`` (for ``reverts``)."""

    def __init__(self, w3: Web3, to: str) -> None:
        self.w3, self.to = w3, to

    def transact(self, params: Any) -> Any:
        transfer: Any = {**params, "to": self.to}
        return self.w3.eth.send_transaction(transfer)

    def call(self, params: Any, block_identifier: Any = "latest") -> Any:
        transfer: Any = {**params, "to": self.to}
        return self.w3.eth.call(transfer, block_identifier)


# ---------------------------------------------------------------- deployment and wiring


def test_constructors_reject_bad_parameters(world: World) -> None:
    w = world
    deploy_reverts(w, "NodeRegistry", (0, 100, w.deployer), "ZeroAmount")
    deploy_reverts(w, "NodeRegistry", (ETH, 0, w.deployer), "ZeroUnbondingDelay")
    deploy_reverts(w, "NodeRegistry", (ETH, 100, ZERO), "OwnableInvalidOwner", ZERO)
    deploy_reverts(w, "WorkLedger", (w.registry.address, ZERO), "OwnableInvalidOwner", ZERO)
    for bps in (0, MAX_BOUNTY_BPS + 1):
        deploy_reverts(
            w, "Disputes", (w.registry.address, w.ledger.address, w.court.address, bps, 1, 1),
            "BountyOutOfRange", bps, MAX_BOUNTY_BPS,
        )  # fmt: skip
    for bond in (0, 2**128):
        deploy_reverts(
            w, "Disputes", (w.registry.address, w.ledger.address, w.court.address, 500, bond, 1),
            "BondOutOfRange", bond,
        )  # fmt: skip
    for blocks in (0, 2**32):
        deploy_reverts(
            w, "Disputes", (w.registry.address, w.ledger.address, w.court.address, 500, 1, blocks),
            "RevealWindowOutOfRange", blocks,
        )  # fmt: skip
    # The largest bounty, bond and window are accepted.
    deploy_contract(
        w.w3, "Disputes", w.deployer, w.registry.address, w.ledger.address, w.court.address,
        1_000, 2**128 - 1, 2**32 - 1,
    )  # fmt: skip
    # Court(registry, owner, source, fee, phaseBlocks, drawDelayBlocks, minPool)
    court = (w.registry.address, w.deployer)
    for error, bad, args in (
        ("FeeOutOfRange", 0, (0, 0, 10, 2, 7)),
        ("FeeOutOfRange", 2**96 // 20 + 1, (0, 2**96 // 20 + 1, 10, 2, 7)),
        ("BlocksOutOfRange", 0, (0, 1, 0, 2, 7)),
        ("BlocksOutOfRange", 2**32, (0, 1, 2**32, 2, 7)),
        ("BlocksOutOfRange", 0, (1, 1, 10, 0, 7)),
        ("PoolOutOfRange", 2, (1, 1, 10, 2, 2)),
        ("PoolOutOfRange", 4097, (1, 1, 10, 2, 4097)),
    ):
        deploy_reverts(w, "Court", court + args, error, bad)
    deploy_reverts(
        w, "Court", (w.registry.address, ZERO, 0, 1, 1, 1, 3), "OwnableInvalidOwner", ZERO
    )


def test_the_slasher_and_the_disputes_contract_are_named_once_by_the_owner(world: World) -> None:
    w = world
    registry, ledger = w.registry.functions, w.ledger.functions
    reverts(w, registry.setSlasher(w.stranger), w.deployer, "SlasherAlreadySet", w.disputes.address)
    reverts(w, ledger.setDisputes(w.stranger), w.deployer, "DisputesAlreadySet", w.disputes.address)
    court = w.court.functions
    reverts(
        w, court.setArbitrable(w.stranger), w.deployer, "ArbitrableAlreadySet", w.disputes.address
    )
    reverts(
        w, court.setArbitrable(w.stranger), w.stranger, "OwnableUnauthorizedAccount", w.stranger
    )
    fresh_registry = deploy_contract(w.w3, "NodeRegistry", w.deployer, ETH, 100, w.deployer)
    fresh_ledger = deploy_contract(w.w3, "WorkLedger", w.deployer, w.registry.address, w.deployer)
    reverts(w, fresh_registry.functions.setSlasher(ZERO), w.deployer, "ZeroAddress")
    reverts(w, fresh_ledger.functions.setDisputes(ZERO), w.deployer, "ZeroAddress")
    for fn in (fresh_registry.functions.setSlasher, fresh_ledger.functions.setDisputes):
        reverts(w, fn(w.stranger), w.stranger, "OwnableUnauthorizedAccount", w.stranger)
    # Two-step ownership: only the nominee accepts.
    w.tx(fresh_ledger.functions.transferOwnership(w.accomplice), w.deployer)
    reverts(
        w, fresh_ledger.functions.acceptOwnership(), w.stranger, "OwnableUnauthorizedAccount",
        w.stranger,
    )  # fmt: skip
    w.tx(fresh_ledger.functions.acceptOwnership(), w.accomplice)
    reverts(
        w, fresh_ledger.functions.setDisputes(w.stranger), w.deployer,
        "OwnableUnauthorizedAccount", w.deployer,
    )  # fmt: skip


# ---------------------------------------------------------------- registry


def test_register_node_reverts(world: World) -> None:
    w = world
    a = w.register("a", w.wallet(0))
    fresh = w.key("fresh")
    wallet = w.wallet(1)
    for length in (0, 63, 65):
        public_key = fresh.public_key[:length].ljust(length, b"\1")
        reverts(
            w, register_fn(w, fresh, wallet, public_key=public_key), wallet, "PublicKeyInvalid",
            length, value=ETH,
        )  # fmt: skip
    # Registered once, from whichever wallet.
    reverts(w, register_fn(w, a, wallet), wallet, "NodeAlreadyRegistered", a.address, value=ETH)
    for stake in (0, ETH - 1):
        reverts(
            w, register_fn(w, fresh, wallet), wallet, "InsufficientStake", fresh.address, stake,
            ETH, value=stake,
        )  # fmt: skip
    # The binding must be the node key's own signature over this wallet and this registry.
    digest = binding_digest(wallet, fresh.address, w.registry_domain)
    by_other_key = sign_digest(digest, a.private_key)
    reverts(
        w, register_fn(w, fresh, wallet, signature=by_other_key), wallet, "BadBindingSignature",
        fresh.address, a.address, value=ETH,
    )  # fmt: skip
    for_other_wallet = sign_binding(w.wallet(2), fresh.private_key, w.registry_domain)
    other_registry = registry_domain(w.w3.eth.chain_id, w.ledger.address)
    for_other_registry = sign_binding(wallet, fresh.private_key, other_registry)
    for signature in (for_other_wallet, for_other_registry):
        recovered = recover_digest_signer(digest, signature)
        assert recovered != fresh.address
        reverts(
            w, register_fn(w, fresh, wallet, signature=signature), wallet, "BadBindingSignature",
            fresh.address, recovered, value=ETH,
        )  # fmt: skip
    assert w.call(w.registry.functions.bondOf(fresh.address))[2] == 0  # still unknown


@pytest.mark.parametrize(
    "capacity",
    [
        ("", 1, 1, 1),
        ("x" * 65, 1, 1, 1),
        ("GPU", 0, 1, 1),
        ("GPU", 1, 0, 1),
        ("GPU", 1, 1, 0),
    ],
    ids=["empty-model", "long-model", "no-memory", "no-throughput", "no-slots"],
)
def test_register_and_update_reject_invalid_capacity(
    world: World, capacity: tuple[Any, ...]
) -> None:
    w = world
    fresh = w.key("fresh")
    reverts(
        w, register_fn(w, fresh, w.wallet(0), capacity=capacity), w.wallet(0), "InvalidCapacity",
        value=ETH,
    )  # fmt: skip
    a = w.register("a", w.wallet(0))
    reverts(
        w, w.registry.functions.updateCapacity(a.address, capacity), w.wallet(0), "InvalidCapacity"
    )


def test_the_longest_gpu_model_name_is_accepted(world: World) -> None:
    w = world
    fresh = w.key("fresh")
    w.tx(register_fn(w, fresh, w.wallet(0), capacity=("x" * 64, 1, 1, 1)), w.wallet(0), ETH)
    assert w.call(w.registry.functions.getNode(fresh.address))[6][0] == "x" * 64


def test_register_rejects_malformed_binding_signatures(world: World) -> None:
    w = world
    key = w.key("fresh")
    good = sign_binding(w.wallet(0), key.private_key, w.registry_domain)
    high_s = (SECP256K1_ORDER - int.from_bytes(good[32:64], "big")).to_bytes(32, "big")
    cases = [
        (good[:64], "ECDSAInvalidSignatureLength", (64,)),
        (good + b"\0", "ECDSAInvalidSignatureLength", (66,)),
        (good[:32] + high_s + bytes([55 - good[64]]), "ECDSAInvalidSignatureS", (high_s,)),
        (b"\x00" * 64 + b"\x1b", "ECDSAInvalidSignature", ()),
        (good[:64] + b"\x1d", "ECDSAInvalidSignature", ()),  # v = 29
    ]
    for signature, error, args in cases:
        fn = register_fn(w, key, w.wallet(0), signature=signature)
        reverts(w, fn, w.wallet(0), error, *args, value=ETH)


def test_registry_views_reject_bad_keys_and_pages(world: World) -> None:
    w = world
    registry = w.registry.functions
    call_reverts(registry.nodeAddressOf(b"\1" * 65), "PublicKeyInvalid", 65)
    call_reverts(registry.peerIdOf(b""), "PublicKeyInvalid", 0)
    call_reverts(registry.nodesOf(w.wallet(0), 0, 101), "PageTooLarge", 101, 100)
    assert w.call(registry.nodesOf(w.wallet(0), 0, 100)) == []


def test_stake_reverts_follow_the_node_status(world: World) -> None:
    w = world
    registry = w.registry.functions
    a = w.register("a", w.wallet(0))
    ghost = w.key("ghost").address
    for fn in (
        registry.addStake(ghost),
        registry.updateCapacity(ghost, default_capacity()),
        registry.requestUnstake(ghost),
        registry.withdrawStake(ghost),
    ):
        reverts(w, fn, w.wallet(0), "UnknownNode", ghost)
    for fn in (
        registry.addStake(a.address),
        registry.updateCapacity(a.address, default_capacity()),
        registry.requestUnstake(a.address),
        registry.withdrawStake(a.address),
    ):
        reverts(w, fn, w.wallet(1), "NotNodeWallet", a.address, w.wallet(1))
    reverts(w, registry.addStake(a.address), w.wallet(0), "ZeroAmount")
    reverts(
        w, registry.withdrawStake(a.address), w.wallet(0), "NodeNotUnbonding", a.address, ACTIVE
    )

    w.tx(registry.requestUnstake(a.address), w.wallet(0))
    unlock_at = w.call(registry.unlockAt(a.address))
    for status in (UNBONDING, WITHDRAWN):
        reverts(
            w, registry.addStake(a.address), w.wallet(0), "NodeNotActive", a.address, status,
            value=1,
        )  # fmt: skip
        reverts(
            w, registry.updateCapacity(a.address, default_capacity()), w.wallet(0),
            "NodeNotActive", a.address, status,
        )  # fmt: skip
        reverts(
            w, registry.requestUnstake(a.address), w.wallet(0), "NodeNotActive", a.address, status
        )
        if status == UNBONDING:
            # Pinned times, so that the arguments do not depend on the wall clock.
            for at in (unlock_at - UNBONDING_S // 2, unlock_at - 1):
                w.travel_to(at)
                reverts(
                    w, registry.withdrawStake(a.address), w.wallet(0), "StakeStillLocked",
                    a.address, unlock_at, at,
                )  # fmt: skip
            w.tx(registry.withdrawStake(a.address), w.wallet(0))  # mined at unlock_at
    reverts(
        w, registry.withdrawStake(a.address), w.wallet(0), "NodeNotUnbonding", a.address, WITHDRAWN
    )


def test_a_slashed_node_can_neither_stake_nor_withdraw(certified: Certified) -> None:
    w, run, a, b = certified.w, certified.run, certified.a, certified.b
    registry = w.registry.functions
    w.prove(equivocation(w, a, *conflicting(w, run, 0, certified.data, a, b)))
    assert w.status_of(a) == SLASHED
    reverts(
        w, registry.addStake(a.address), w.wallet(0), "NodeNotActive", a.address, SLASHED, value=1
    )
    reverts(w, registry.requestUnstake(a.address), w.wallet(0), "NodeNotActive", a.address, SLASHED)
    reverts(
        w, registry.withdrawStake(a.address), w.wallet(0), "NodeNotUnbonding", a.address, SLASHED
    )


def test_only_the_slasher_slashes_and_only_known_nodes(world: World) -> None:
    w = world
    a = w.register("a", w.wallet(0))
    for caller in (w.stranger, w.deployer, w.wallet(0)):
        reverts(w, w.registry.functions.slash(a.address), caller, "NotSlasher", caller)
    # The slasher itself cannot slash a key nobody registered: an equivocation of such a key
    # reaches the registry and bubbles its UnknownNode up.
    run = w.open_run()
    ghost, peer = w.key("ghost"), w.key("peer")
    proof = equivocation(w, ghost, *conflicting(w, run, 0, peer, ghost, peer))
    proof_reverts(w, proof, "UnknownNode", ghost.address)
    assert w.stake_of(a) == 2 * ETH


# The overflow guards need more ETH than eth-tester's default accounts hold (1e6 ETH each):
# a second chain whose accounts each hold 2**130 wei.
RICH_WEI = 2**130


@pytest.fixture(scope="module")
def rich_chain() -> World:
    genesis = PyEVMBackend.generate_genesis_state(overrides={"balance": RICH_WEI}, num_accounts=10)
    tester = EthereumTester(PyEVMBackend(genesis_state=genesis))
    w3 = Web3(EthereumTesterProvider(tester))
    suite = deploy_suite(w3, w3.eth.accounts[0], TEST_PARAMS)
    return World(tester=tester, w3=w3, suite=suite, params=TEST_PARAMS)


@pytest.fixture
def rich(rich_chain: World) -> Iterator[World]:
    snapshot = rich_chain.tester.take_snapshot()
    try:
        yield rich_chain
    finally:
        rich_chain.tester.revert_to_snapshot(snapshot)


def test_a_stake_never_exceeds_uint88(rich: World) -> None:
    w = rich
    assert w.balance(w.wallet(0)) == RICH_WEI
    fresh = w.key("fresh")
    reverts(w, register_fn(w, fresh, w.wallet(0)), w.wallet(0), "StakeOverflow", 2**88, value=2**88)
    w.register("fresh", w.wallet(0), 2**88 - 1)
    reverts(
        w, w.registry.functions.addStake(fresh.address), w.wallet(0), "StakeOverflow", 2**88,
        value=1,
    )  # fmt: skip
    assert w.stake_of(fresh) == 2**88 - 1


def test_a_run_pool_never_exceeds_uint128(rich: World) -> None:
    w = rich
    ledger = w.ledger.functions
    reverts(w, ledger.openRun(w.run_config()), w.sponsor, "FundsOverflow", 2**128, value=2**128)
    run = w.open_run(2**128 - 1)
    reverts(w, ledger.fundRun(run), w.sponsor, "FundsOverflow", 2**128, value=1)
    assert w.call(ledger.getRun(run))[5] == 2**128 - 1


# ---------------------------------------------------------------- runs


@pytest.mark.parametrize(
    ("overrides", "error", "args"),
    [
        ({"stageCount": 0}, "StageCountOutOfRange", (0, 1024)),
        ({"stageCount": 1025}, "StageCountOutOfRange", (1025, 1024)),
        ({"epochLengthS": 0}, "EpochLengthOutOfRange", (0, MAX_EPOCH_LENGTH_S)),
        (
            {"epochLengthS": MAX_EPOCH_LENGTH_S + 1},
            "EpochLengthOutOfRange",
            (MAX_EPOCH_LENGTH_S + 1, MAX_EPOCH_LENGTH_S),
        ),
        ({"challengeWindowS": 599}, "ChallengeWindowTooShort", (599, 600)),
        ({"unitsPerHop": 0}, "UnitsPerHopOutOfRange", (0, MAX_UNITS_PER_HOP)),
        (
            {"unitsPerHop": MAX_UNITS_PER_HOP + 1},
            "UnitsPerHopOutOfRange",
            (MAX_UNITS_PER_HOP + 1, MAX_UNITS_PER_HOP),
        ),
        ({"minStakeWei": 2**88}, "MinStakeTooLarge", (2**88, 2**88 - 1)),
        ({"rewardPerEpochWei": 0}, "ZeroRewardPerEpoch", ()),
        ({"hopPriceWei": 0}, "ZeroHopPrice", ()),
        ({"minStakeWei": ETH - 1}, "MinStakeBelowRegistry", (ETH - 1, ETH)),
        (
            {"epochLengthS": (UNBONDING_S - WINDOW_S) // 2 + 1},
            "WindowsExceedUnbonding",
            (UNBONDING_S + 2, UNBONDING_S),
        ),
    ],
)
def test_open_run_validates_its_config(
    world: World, overrides: dict[str, int], error: str, args: tuple[Any, ...]
) -> None:
    reverts(
        world, world.ledger.functions.openRun(world.run_config(**overrides)), world.sponsor,
        error, *args, value=ETH,
    )  # fmt: skip


def test_open_run_accepts_the_limits(world: World) -> None:
    w = world
    # Windows that exactly fill the unbonding delay, the shortest challenge window, 1024 stages.
    limits = {
        "epochLengthS": (UNBONDING_S - 600) // 2,
        "challengeWindowS": UNBONDING_S - 2 * ((UNBONDING_S - 600) // 2),
        "stageCount": 1024,
        "unitsPerHop": MAX_UNITS_PER_HOP,
        "minStakeWei": 2**88 - 1,
    }
    assert 2 * limits["epochLengthS"] + limits["challengeWindowS"] == UNBONDING_S
    assert limits["challengeWindowS"] == 600
    run = w.open_run(0, **limits)
    assert w.call(w.ledger.functions.getRun(run))[3] == 1024


EMPTY_HOP = LeafProof(CertifiedHop(0, 0, ZERO, 100, b"\0" * 32, b"\0" * 32, b"\0" * 32), ())
# (function, caller: "sponsor" or "wallet", build(ledger functions, node)): every function that
# takes a run id, called by whoever it would otherwise accept, so that the run is what fails.
UNKNOWN_RUN_CALLS: list[tuple[str, str, Callable[[Any, str], Any]]] = [
    ("fundRun", "sponsor", lambda f, node: f.fundRun(99)),
    ("addDataNode", "sponsor", lambda f, node: f.addDataNode(99, node)),
    ("closeRun", "sponsor", lambda f, node: f.closeRun(99)),
    ("withdrawRefund", "sponsor", lambda f, node: f.withdrawRefund(99)),
    ("joinRun", "wallet", lambda f, node: f.joinRun(99, node)),
    ("leaveRun", "wallet", lambda f, node: f.leaveRun(99, node)),
    (
        "submitCertificates",
        "sponsor",
        lambda f, node: f.submitCertificates(99, 0, node, b"\1" * 32, 1, 100, [(node, 0, 100)]),
    ),
    (
        "claimReward",
        "wallet",
        lambda f, node: f.claimReward(
            *claim_reward_args(
                CertRef(99, 0, node, b"\1" * 32, 1, 100, b"\1" * 32), EMPTY_HOP, EMPTY_HOP, ()
            )
        ),
    ),
    ("currentEpoch", "view", lambda f, node: f.currentEpoch(99)),
    ("epochTimes", "view", lambda f, node: f.epochTimes(99, 0)),
    ("refundableAt", "view", lambda f, node: f.refundableAt(99)),
]


@pytest.mark.parametrize(
    ("function", "caller", "build"), UNKNOWN_RUN_CALLS, ids=[c[0] for c in UNKNOWN_RUN_CALLS]
)
def test_an_unknown_run_is_refused_everywhere(
    staffed: Staffed, function: str, caller: str, build: Callable[[Any, str], Any]
) -> None:
    w = staffed.w
    if caller == "view":
        call_reverts(build(w.ledger.functions, staffed.a.address), "UnknownRun", 99)
        return
    sender, node = (
        (w.sponsor, staffed.data.address)
        if caller == "sponsor"
        else (w.wallet(0), staffed.a.address)
    )
    value = 1 if function == "fundRun" else 0
    reverts(w, build(w.ledger.functions, node), sender, "UnknownRun", 99, value=value)


def test_run_lifecycle_reverts(world: World) -> None:
    w = world
    ledger = w.ledger.functions
    run = w.open_run()
    reverts(w, ledger.fundRun(run), w.stranger, "NotSponsor", run, w.stranger, value=1)
    reverts(w, ledger.closeRun(run), w.wallet(0), "NotSponsor", run, w.wallet(0))
    reverts(w, ledger.fundRun(run), w.sponsor, "ZeroAmount")
    reverts(w, ledger.withdrawRefund(run), w.sponsor, "RunNotClosed", run)
    w.tx(ledger.closeRun(run), w.sponsor)
    refundable_at = w.call(ledger.refundableAt(run))
    assert refundable_at == w.epoch_times(run, 0)[2]
    reverts(w, ledger.closeRun(run), w.sponsor, "RunIsClosed", run)
    reverts(w, ledger.fundRun(run), w.sponsor, "RunIsClosed", run, value=1)
    a = w.register("a", w.wallet(0))
    data = w.register("data", w.sponsor)
    reverts(w, ledger.joinRun(run, a.address), w.wallet(0), "RunIsClosed", run)
    reverts(w, ledger.addDataNode(run, data.address), w.sponsor, "RunIsClosed", run)
    for at in (refundable_at - 500, refundable_at - 1):
        w.travel_to(at)
        reverts(w, ledger.withdrawRefund(run), w.sponsor, "RefundNotYet", run, refundable_at, at)
    w.tx(ledger.withdrawRefund(run), w.sponsor)
    reverts(w, ledger.withdrawRefund(run), w.sponsor, "NothingToWithdraw", w.sponsor)
    # A run opened without funds has nothing to refund at all.
    empty = w.open_run(0)
    w.tx(ledger.closeRun(empty), w.sponsor)
    w.travel_to(max(w.call(ledger.refundableAt(empty)), w.now() + 1))
    reverts(w, ledger.withdrawRefund(empty), w.sponsor, "NothingToWithdraw", w.sponsor)
    call_reverts(ledger.activeNodesOfRun(run, 0, 101), "PageTooLarge", 101, 100)


def test_data_node_reverts(world: World) -> None:
    w = world
    ledger = w.ledger.functions
    run = w.open_run(minStakeWei=2 * ETH)
    data = w.register("data", w.sponsor, 2 * ETH)
    small = w.register("small", w.sponsor, ETH)
    relay = w.register("relay", w.sponsor, 2 * ETH)
    leaving = w.register("leaving", w.sponsor, 2 * ETH)
    a = w.register("a", w.wallet(0), 2 * ETH)
    ghost = w.key("ghost").address
    reverts(w, ledger.addDataNode(run, data.address), w.stranger, "NotSponsor", run, w.stranger)
    # Only the sponsor's own nodes: a data node certifies with the sponsor's wallet.
    reverts(
        w, ledger.addDataNode(run, a.address), w.sponsor, "DataNodeNotSponsors", a.address,
        w.wallet(0),
    )  # fmt: skip
    reverts(w, ledger.addDataNode(run, ghost), w.sponsor, "DataNodeNotSponsors", ghost, ZERO)
    reverts(
        w, ledger.addDataNode(run, small.address), w.sponsor, "StakeBelowRunMinimum",
        small.address, ETH, 2 * ETH,
    )  # fmt: skip
    w.tx(w.registry.functions.requestUnstake(leaving.address), w.sponsor)
    reverts(
        w, ledger.addDataNode(run, leaving.address), w.sponsor, "NodeNotActive", leaving.address
    )
    # A relay of the run cannot become its data node, nor a data node its relay.
    w.join(run, relay, w.sponsor)
    reverts(
        w, ledger.addDataNode(run, relay.address), w.sponsor, "AlreadyMember", run, relay.address
    )
    w.add_data_node(run, data)
    reverts(
        w, ledger.addDataNode(run, data.address), w.sponsor, "AlreadyDataNode", run, data.address
    )
    reverts(w, ledger.joinRun(run, data.address), w.sponsor, "AlreadyDataNode", run, data.address)


def test_membership_reverts(world: World) -> None:
    w = world
    ledger = w.ledger.functions
    run = w.open_run(minStakeWei=3 * ETH)
    a = w.register("a", w.wallet(0), 2 * ETH)
    b = w.register("b", w.wallet(1), 3 * ETH)
    ghost = w.key("ghost").address
    reverts(
        w, ledger.joinRun(run, a.address), w.wallet(0), "StakeBelowRunMinimum", a.address,
        2 * ETH, 3 * ETH,
    )  # fmt: skip
    reverts(w, ledger.joinRun(run, b.address), w.wallet(0), "NotNodeWallet", b.address, w.wallet(0))
    reverts(w, ledger.joinRun(run, ghost), w.wallet(0), "NotNodeWallet", ghost, w.wallet(0))
    reverts(w, ledger.leaveRun(run, b.address), w.wallet(1), "NotMember", run, b.address)
    w.join(run, b, w.wallet(1))
    reverts(w, ledger.joinRun(run, b.address), w.wallet(1), "AlreadyMember", run, b.address)
    reverts(
        w, ledger.leaveRun(run, b.address), w.wallet(0), "NotNodeWallet", b.address, w.wallet(0)
    )
    w.tx(ledger.leaveRun(run, b.address), w.wallet(1))
    # Leaving is for good.
    reverts(w, ledger.leaveRun(run, b.address), w.wallet(1), "NotMember", run, b.address)
    reverts(w, ledger.joinRun(run, b.address), w.wallet(1), "AlreadyLeft", run, b.address)
    other = w.open_run(minStakeWei=3 * ETH)
    w.tx(w.registry.functions.requestUnstake(b.address), w.wallet(1))
    reverts(w, ledger.joinRun(other, b.address), w.wallet(1), "NodeNotActive", b.address)


# ---------------------------------------------------------------- certificates


def test_submission_reverts(staffed: Staffed) -> None:
    s = staffed
    w, run = s.w, s.run
    ledger = w.ledger.functions
    root = keccak(text="root")

    low, high = sorted((s.a.address, s.b.address), key=lambda a: int(a, 16))

    def submit(
        epoch: int = 0, node: NodeKey = s.data, count: int = 2, units: int = 300,
        spans: list[tuple[str, int, int]] | None = None,
    ) -> Any:  # fmt: skip
        spans = [(low, 0, 100), (high, max(count - 1, 1), units)] if spans is None else spans
        return ledger.submitCertificates(run, epoch, node.address, root, count, units, spans)

    _, opens_at, closes_at, _ = w.epoch_times(run, 0)
    reverts(w, submit(), w.sponsor, "SubmissionClosed", run, 0, opens_at, closes_at)
    w.to_submission(run, 0)
    reverts(w, submit(count=0, units=0), w.sponsor, "EmptyCertificate")
    reverts(w, submit(units=199), w.sponsor, "UnitsOutOfRange", 199, 200, 400)
    reverts(w, submit(units=401), w.sponsor, "UnitsOutOfRange", 401, 200, 400)
    # A future epoch is not open yet either.
    _, opens_5, closes_5, _ = w.epoch_times(run, 5)
    reverts(w, submit(epoch=5), w.sponsor, "SubmissionClosed", run, 5, opens_5, closes_5)
    reverts(w, submit(node=s.a), w.wallet(0), "NotDataNode", run, s.a.address)
    # A data node named after the epoch ended did not work in it.
    late = w.register("late", w.sponsor)
    w.add_data_node(run, late)
    reverts(w, submit(node=late), w.sponsor, "NotDataNode", run, late.address)
    reverts(w, submit(), w.stranger, "NotNodeWallet", s.data.address, w.stranger)
    # The spans must partition the leaves and units by strictly increasing worker.
    for spans, position in (
        ([], 0),
        ([(high, 0, 100), (low, 1, 300)], 1),  # workers out of order
        ([(low, 0, 100), (low, 1, 300)], 1),  # one worker twice
        ([(ZERO, 1, 300)], 0),  # no worker
        ([(low, 1, 100), (high, 1, 300)], 1),  # a span of no leaves
        ([(low, 0, 0), (high, 1, 300)], 0),  # a span of no units
        ([(low, 0, 200), (high, 1, 150)], 1),  # units going back
        ([(low, 0, 100), (high, 2, 300)], 1),  # past the last leaf
        ([(low, 0, 100)], 1),  # leaves left over
        ([(low, 0, 100), (high, 1, 299)], 2),  # units left over
    ):
        reverts(w, submit(spans=spans), w.sponsor, "BadSpans", position)
    w.tx(submit(), w.sponsor)
    reverts(w, submit(), w.sponsor, "CertificateAlreadySubmitted", run, 0, s.data.address)
    w.travel_to(closes_at)
    reverts(w, submit(), w.sponsor, "SubmissionClosed", run, 0, opens_at, closes_at)
    # Closing the run during epoch 2 makes it the last.
    w.tx(ledger.closeRun(run), w.sponsor)
    last_epoch = w.call(ledger.getRun(run))[9]
    assert last_epoch == 2
    reverts(w, submit(epoch=3), w.sponsor, "EpochAfterClose", run, 3, 2)


def test_a_data_node_that_unbonded_before_an_epoch_cannot_certify_it(staffed: Staffed) -> None:
    w, run, data = staffed.w, staffed.run, staffed.data
    w.tx(w.registry.functions.requestUnstake(data.address), w.sponsor)
    w.to_submission(run, 0)
    # Epoch 0: still bonded when it started; epoch 1: unbonding all along.
    one = [(data.address, 0, 100)]
    w.tx(
        w.ledger.functions.submitCertificates(run, 0, data.address, b"\1" * 32, 1, 100, one),
        w.sponsor,
    )
    w.to_submission(run, 1)
    reverts(
        w, w.ledger.functions.submitCertificates(run, 1, data.address, b"\1" * 32, 1, 100, one),
        w.sponsor, "NodeNotBonded", data.address,
    )  # fmt: skip


def test_a_data_node_slashed_during_an_epoch_certifies_it_but_no_later_one(
    staffed: Staffed,
) -> None:
    """The work relays did with a data node while it was bonded is still certified after the
    data node is convicted: a conviction voids no epoch that no proof touched."""
    s = staffed
    w, run, data = s.w, s.run, s.data
    w.to_submission(run, 0)  # epoch 1
    w.prove(equivocation(w, data, *conflicting(w, run, 1, data, data, s.a)))
    assert w.status_of(data) == SLASHED
    w.to_submission(run, 1)
    one = [(data.address, 0, 100)]
    w.tx(
        w.ledger.functions.submitCertificates(run, 1, data.address, b"\1" * 32, 1, 100, one),
        w.sponsor,
    )
    # Slashed before epoch 2 began: not bonded during it at all.
    w.to_submission(run, 2)
    reverts(
        w, w.ledger.functions.submitCertificates(run, 2, data.address, b"\1" * 32, 1, 100, one),
        w.sponsor, "NodeNotBonded", data.address,
    )  # fmt: skip


def test_void_certificate_is_for_the_disputes_contract_only(certified: Certified) -> None:
    w, cert = certified.w, certified.cert
    for caller in (w.stranger, w.deployer, w.sponsor):
        reverts(
            w, w.ledger.functions.voidCertificate(cert.as_tuple()), caller, "NotDisputes", caller
        )


# ---------------------------------------------------------------- claims


def test_claim_reverts(certified: Certified) -> None:
    c = certified
    w, run, tree, cert = c.w, c.run, c.tree, c.cert
    ledger = w.ledger.functions
    span_a, span_b = tree.worker_range(c.a.address), tree.worker_range(c.b.address)
    assert span_a is not None and span_b is not None
    assert span_a.first.hop.index != span_a.last.hop.index

    def claim(
        cert_: Any = cert, first: LeafProof = span_a.first, last: LeafProof = span_a.last,
        range_proof: tuple[bytes, ...] = span_a.range_proof,
    ) -> Any:  # fmt: skip
        return ledger.claimReward(*claim_reward_args(cert_, first, last, range_proof))

    settles_at = w.epoch_times(run, 0)[3]
    reverts(w, claim(), w.wallet(0), "NotSettled", run, 0, settles_at)
    w.travel_to(settles_at - 1)
    reverts(w, claim(), w.wallet(0), "NotSettled", run, 0, settles_at)
    w.to_settled(run, 0)
    reverts(
        w, claim(replace(cert, dataNode=c.a.address)), w.wallet(0), "CertificateNotOpen", run, 0,
        c.a.address,
    )  # fmt: skip
    for wrong in (
        replace(cert, root=keccak(text="other root")),
        replace(cert, count=cert.count + 1),
        replace(cert, units=cert.units - 1),
        replace(cert, rangesRoot=keccak(text="other spans")),
    ):
        reverts(w, claim(wrong), w.wallet(0), "CertificateMismatch", run, 0, c.data.address)
    # A leaf with another leaf's proof, or with inflated units, is not in the tree.
    misproven = LeafProof(span_a.first.hop, span_a.last.proof)
    reverts(
        w, claim(first=misproven), w.wallet(0), "LeafNotInTree", c.data.address,
        span_a.first.hop.index,
    )  # fmt: skip
    inflated = LeafProof(
        replace(span_a.last.hop, units=span_a.last.hop.units + 1), span_a.last.proof
    )
    reverts(
        w, claim(last=inflated), w.wallet(0), "LeafNotInTree", c.data.address,
        span_a.last.hop.index,
    )  # fmt: skip
    # Both ends must be the worker's, in order, and bound its span in the range tree.
    a_first, a_last, b_last = (
        span_a.first.hop.index, span_a.last.hop.index, span_b.last.hop.index,
    )  # fmt: skip
    reverts(
        w, claim(last=span_b.last), w.wallet(0), "NotWorkersRange", c.a.address, a_first, b_last
    )
    reverts(
        w, claim(first=span_a.last, last=span_a.first), w.wallet(0), "NotWorkersRange",
        c.a.address, a_last, a_first,
    )  # fmt: skip
    reverts(
        w, claim(range_proof=span_b.range_proof), w.wallet(0), "NotWorkersRange", c.a.address,
        a_first, a_last,
    )  # fmt: skip
    for caller in (w.stranger, w.wallet(1), w.sponsor):
        reverts(w, claim(), caller, "NotNodeWallet", c.a.address, caller)
    w.tx(claim(), w.wallet(0))
    reverts(w, claim(), w.wallet(0), "AlreadyClaimed", run, 0, c.data.address, c.a.address)
    # A sub-range is no span.
    reverts(
        w, claim(last=span_a.first), w.wallet(0), "NotWorkersRange", c.a.address, a_first, a_first
    )


def crafted_hop(index: int, units_before: int, worker: NodeKey, units: int) -> CertifiedHop:
    tag = f"{index} {worker.address}"
    return CertifiedHop(
        index, units_before, worker.address, units, keccak(text="key " + tag),
        keccak(text="digest " + tag), keccak(text="signatures " + tag),
    )  # fmt: skip


def test_a_span_of_no_units_is_refused_at_submission(staffed: Staffed) -> None:
    s = staffed
    w, run = s.w, s.run
    low, high = sorted((s.a, s.b), key=lambda k: int(k.address, 16))
    tree = w.dishonest_tree([crafted_hop(0, 0, low, 0), crafted_hop(1, 0, high, 200)])
    spans = [WorkerSpan(low.address, 0, 0), WorkerSpan(high.address, 1, 200)]
    w.to_submission(run, 0)
    cert = w.cert_of(tree, run, 0, s.data.address, spans=spans)
    reverts(w, w.submit_fn(cert), w.sponsor, "BadSpans", 0)


def test_claims_of_an_unproven_dishonest_tree_are_held_to_its_spans(staffed: Staffed) -> None:
    """A dishonest tree nobody proved before settlement: its leaves' ranges overlap or run past
    its total, but the spans submitted with it partition its 400 units. A claim whose ends
    bound no span is refused; each span is paid once, and never more than the certificate."""
    s = staffed
    w, run = s.w, s.run
    a, b, c = sorted((s.a, s.b, s.c), key=lambda k: int(k.address, 16))
    wallet_of = {s.a.address: w.wallet(0), s.b.address: w.wallet(1), s.c.address: w.wallet(2)}
    hops = [
        crafted_hop(0, 0, a, 100),
        crafted_hop(1, 0, b, 400),  # overlaps a's and c's units
        crafted_hop(2, 100, b, 100),
        crafted_hop(3, 500, c, 100),  # runs past the total
    ]
    spans = [WorkerSpan(a.address, 0, 100), WorkerSpan(b.address, 2, 300)]
    spans.append(WorkerSpan(c.address, 3, 400))
    tree = w.dishonest_tree(hops, spans)
    cert = w.cert_of(tree, run, 0, s.data.address, units=400, spans=spans)
    w.to_submission(run, 0)
    w.submit(cert)
    w.to_settled(run, 0)
    ledger = w.ledger.functions

    def claim(first: int, last: int, span: int) -> Any:
        assert tree.ranges is not None
        proof = tuple(tree.ranges.proof(span))
        return ledger.claimReward(
            *claim_reward_args(cert, tree.leaf_proof(first), tree.leaf_proof(last), proof)
        )

    # b's span is 100..300: its leaf 1 claims 0..400 and leaves 1..2 0..200, neither the span.
    reverts(w, claim(1, 1, 1), wallet_of[b.address], "NotWorkersRange", b.address, 1, 1)
    reverts(w, claim(1, 2, 1), wallet_of[b.address], "NotWorkersRange", b.address, 1, 2)
    # c's leaf says 500..600, its span 300..400.
    reverts(w, claim(3, 3, 2), wallet_of[c.address], "NotWorkersRange", c.address, 3, 3)
    w.tx(claim(0, 0, 0), wallet_of[a.address])  # a: its 100 units, exactly its span
    book = w.call(ledger.epochBook(run, 0))
    assert (book[3], book[4]) == (100, HOP_PRICE)  # one hop's price
    assert not w.call(ledger.isClaimed(run, 0, s.data.address, b.address))


# ---------------------------------------------------------------- disputes


def test_commitment_reverts(certified: Certified) -> None:
    c = certified
    w = c.w
    proof = fraud_proofs.bad_totals(c.cert, c.tree.leaf_proof(0))
    salt = b"\x07" * 32
    commitment = fraud_proofs.commitment_of(w.challenger, salt, proof.proof_hash)
    reverts(w, w.reveal_fn(proof, salt), w.challenger, "NoCommitment", commitment)
    w.commit(proof, w.challenger, salt)
    reverts(w, w.disputes.functions.commit(commitment), w.stranger, "CommitmentExists", commitment)
    # Someone else revealing the proof has no commitment: theirs would bind their address.
    copied = fraud_proofs.commitment_of(w.stranger, salt, proof.proof_hash)
    reverts(w, w.reveal_fn(proof, salt), w.stranger, "NoCommitment", copied)
    # The committer's reveal reaches the judgement (an honest leaf: the totals are backed).
    reverts(w, w.reveal_fn(proof, salt), w.challenger, "TotalsBacked", 0)


def test_a_reveal_in_the_commitment_block_is_too_recent(certified: Certified) -> None:
    c = certified
    w = c.w
    proof = fraud_proofs.bad_totals(c.cert, c.tree.leaf_proof(0))
    salt = b"\x08" * 32
    commitment = fraud_proofs.commitment_of(w.challenger, salt, proof.proof_hash)
    # One block for both: anyone may post the commitment (it binds the challenger's address),
    # so a second sender keeps the two transactions apart in eth-tester's nonce check.
    w.tester.disable_auto_mine_transactions()
    try:
        commit_hash = w.disputes.functions.commit(commitment).transact(
            {"from": w.stranger, "gas": TEST_GAS_LIMIT}
        )
        reveal_hash = w.reveal_fn(proof, salt).transact(
            {"from": w.challenger, "gas": TEST_GAS_LIMIT}
        )
        w.mine()
    finally:
        w.tester.enable_auto_mine_transactions()
    committed = w.w3.eth.get_transaction_receipt(commit_hash)
    revealed = w.w3.eth.get_transaction_receipt(reveal_hash)
    block = committed["blockNumber"]
    assert revealed["blockNumber"] == block
    assert (committed["status"], revealed["status"]) == (1, 0)
    # Replayed in its block (as `transact` does for a mined revert): too recent.
    with pytest.raises((TransactionFailed, ContractLogicError)) as excinfo:
        w.reveal_fn(proof, salt).call({"from": w.challenger}, block_identifier=block)
    revert = decode_revert(excinfo.value, all_errors_abi())
    assert (revert.name, revert.args) == ("CommitmentTooRecent", (commitment, block))
    # The commitment survives the failed reveal and serves a block later.
    assert w.call(w.disputes.functions.commitments(commitment))[0] == block
    reverts(w, w.reveal_fn(proof, salt), w.challenger, "TotalsBacked", 0)


def test_certificate_proof_reverts(certified: Certified) -> None:
    c = certified
    w, run, tree, cert = c.w, c.run, c.tree, c.cert
    last = tree.count - 1
    # Proofs against honest data are judged and refused.
    for index in (0, 5, last):
        proof_reverts(
            w, fraud_proofs.bad_totals(cert, tree.leaf_proof(index)), "TotalsBacked", index
        )
        entry = tree.entries[index]
        assert entry is not None
        proof = fraud_proofs.invalid_hop(cert, tree.leaf_proof(index), entry)
        proof_reverts(w, proof, "HopValid", index)
    for i, j in ((3, 4), (3, 3)):
        proof = fraud_proofs.bad_sequence(cert, tree.leaf_proof(i), tree.leaf_proof(j))
        proof_reverts(w, proof, "SequenceConsistent", i, j)
    for i, j in ((0, 2), (4, 3)):
        proof = fraud_proofs.bad_sequence(cert, tree.leaf_proof(i), tree.leaf_proof(j))
        proof_reverts(w, proof, "LeavesNotAdjacent", i, j)
    # The receipt must be the leaf's.
    other_entry = tree.entries[1]
    assert other_entry is not None
    proof = fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), other_entry)
    proof_reverts(w, proof, "NotTheLeafsReceipt", 0)
    # The leaf must be in the certificate's tree, the certificate as submitted and open.
    misproven = LeafProof(tree.hops[0], tree.leaf_proof(1).proof)
    proof_reverts(w, fraud_proofs.bad_totals(cert, misproven), "LeafNotInTree", c.data.address, 0)
    proof = fraud_proofs.bad_sequence(cert, tree.leaf_proof(2), misproven)
    proof_reverts(w, proof, "LeafNotInTree", c.data.address, 0)
    unsubmitted = replace(cert, dataNode=c.a.address)
    proof = fraud_proofs.bad_totals(unsubmitted, tree.leaf_proof(0))
    proof_reverts(w, proof, "CertificateNotOpen", run, 0, c.a.address)
    altered = replace(cert, units=cert.units + 1)
    proof = fraud_proofs.bad_totals(altered, tree.leaf_proof(last))
    proof_reverts(w, proof, "CertificateMismatch", run, 0, c.data.address)


def test_a_voided_certificate_is_proven_again_only_by_an_earlier_commitment(
    staffed: Staffed,
) -> None:
    s = staffed
    w, run = s.w, s.run
    hops = [crafted_hop(0, 100, s.a, 100), crafted_hop(1, 200, s.b, 100)]
    tree = w.dishonest_tree(hops)
    cert = w.certify(tree, run, 0, s.data)
    w.prove(fraud_proofs.bad_totals(cert, tree.leaf_proof(0)))
    # Committed after the proof that voided it: it could change nothing.
    proof = fraud_proofs.bad_sequence(cert, tree.leaf_proof(0), tree.leaf_proof(1))
    proof_reverts(w, proof, "AlreadySlashed", s.data.address)
    # A certificate nobody proved against is not open to proofs once gone either.
    w.award(s.data.address)
    proof_reverts(w, proof, "AlreadySlashed", s.data.address)


def test_a_certificate_padded_beyond_its_tree_changes_no_pay_and_locks_nothing(
    staffed: Staffed,
) -> None:
    """A data node submits its honest tree of 8 hops (1,200 units) as a certificate of 16
    leaves and 2,400 units. No proof can show it (leaves it never made have no preimage), but
    it changes nothing a hop earns: each is paid the run's price, and the padding only reserves
    more of the sponsor's own funds, burned when the claim period ends."""
    s = staffed
    w, run = s.w, s.run
    tree = w.certificate_tree(w.pipeline_hops(run, 0, s.data, [s.a, s.b], range(2)))
    assert (tree.count, tree.units) == (8, 1_200)
    w.to_submission(run, 0)
    # The workers' spans are their ranges; the padding is a span of a worker above them.
    assert tree.spans is not None
    spans = [*tree.spans, WorkerSpan(PADDING_WORKER, 15, 2_400)]
    claimed_from = w.dishonest_tree(tree.hops, spans)
    padded = w.cert_of(tree, run, 0, s.data.address, count=16, units=2_400, spans=spans)
    w.submit(padded)
    proofs = [fraud_proofs.bad_totals(padded, tree.leaf_proof(i)) for i in range(8)]
    proofs += [
        fraud_proofs.bad_sequence(padded, tree.leaf_proof(i), tree.leaf_proof(i + 1))
        for i in range(7)
    ]
    last_entry = tree.entries[-1]
    assert last_entry is not None
    proofs.append(fraud_proofs.invalid_hop(padded, tree.leaf_proof(7), last_entry))
    refusals = set()
    for proof in proofs:
        salt = w.commit(proof, w.challenger)
        with pytest.raises(ContractRevert) as refused:
            w.tx(w.reveal_fn(proof, salt), w.challenger)
        refusals.add(refused.value.name)
    assert refusals == {"TotalsBacked", "SequenceConsistent", "HopValid"}
    w.to_settled(run, 0)
    paid = {}
    for key, wallet in ((s.a, w.wallet(0)), (s.b, w.wallet(1))):
        before = w.balance(wallet)
        receipt = w.claim(padded, claimed_from, key, wallet)
        paid[key.address] = (
            w.balance(wallet) - before + receipt["gasUsed"] * receipt["effectiveGasPrice"]
        )
    # a and b each did 2 forwards and 2 backwards: 6 hops' price, padding or not.
    assert paid == {s.a.address: 6 * HOP_PRICE, s.b.address: 6 * HOP_PRICE}
    _, _, _, settles_at = w.epoch_times(run, 0)
    closes_at = settles_at + w.call(w.ledger.functions.CLAIM_PERIOD_S())
    reverts(w, w.ledger.functions.closeEpoch(run, 0), w.stranger, "ClaimPeriodOpen", run, 0,
            closes_at)  # fmt: skip
    w.travel_to(closes_at)
    w.tx(w.ledger.functions.closeEpoch(run, 0), w.stranger)
    reverts(w, w.claim_fn(padded, tree, s.a), w.wallet(0), "ClaimPeriodOver", run, 0, closes_at)
    w.tx(w.ledger.functions.closeRun(run), w.sponsor)
    w.travel_to(max(w.call(w.ledger.functions.refundableAt(run)), w.now() + 1))
    w.tx(w.ledger.functions.withdrawRefund(run), w.sponsor)
    # The padding's reservation (12 hops' price) was never claimable: burned, not refunded.
    burned = w.call(w.ledger.functions.burnedWei())
    assert burned == 12 * HOP_PRICE
    assert w.balance(w.ledger.address) == burned, "nothing else stays in the ledger"


def test_proofs_close_when_the_epoch_settles(certified: Certified) -> None:
    c = certified
    w, run = c.w, c.run
    settles_at = w.epoch_times(run, 0)[3]
    totals = fraud_proofs.bad_totals(c.cert, c.tree.leaf_proof(0))
    equivocated = equivocation(w, c.a, *conflicting(w, run, 0, c.data, c.a, c.b))
    salts = [w.commit(proof, w.challenger) for proof in (totals, equivocated)]
    w.travel_to(settles_at)
    for proof, salt in zip((totals, equivocated), salts, strict=True):
        reverts(
            w, w.reveal_fn(proof, salt), w.challenger, "ChallengePeriodOver", run, 0, settles_at
        )
    assert w.status_of(c.a) == ACTIVE


def test_equivocation_reverts(certified: Certified) -> None:
    c = certified
    w, run, data, a, b = c.w, c.run, c.data, c.a, c.b
    first, second = conflicting(w, run, 0, data, a, b)
    another_hop = replace(second, microbatchId=first.microbatchId + 1)
    proof_reverts(w, equivocation(w, a, first, another_hop), "NotSameHop")
    proof_reverts(w, equivocation(w, a, first, first), "SameReceipt")
    # Two signers, or a signature that recovers to nobody.
    by_two = fraud_proofs.equivocation(
        a.address, first, sign_receipt(first, w.ledger_domain, a.private_key), second,
        sign_receipt(second, w.ledger_domain, b.private_key),
    )  # fmt: skip
    proof_reverts(w, by_two, "NotOneSigner", a.address, b.address)
    garbage = fraud_proofs.equivocation(
        a.address, first, b"\0" * 65, second, sign_receipt(second, w.ledger_domain, a.private_key)
    )
    proof_reverts(w, garbage, "NotOneSigner", ZERO, a.address)
    garbage = fraud_proofs.equivocation(
        a.address, first, sign_receipt(first, w.ledger_domain, a.private_key), second, b"\1" * 64
    )
    proof_reverts(w, garbage, "NotOneSigner", a.address, ZERO)
    # One signer who is neither the worker nor the counterparty of both.
    proof_reverts(w, equivocation(w, c.c, first, second), "SignerNotParty", c.c.address)
    other_counterparty = replace(second, counterparty=c.c.address)
    proof_reverts(w, equivocation(w, b, first, other_counterparty), "SignerNotParty", b.address)
    # A receipt of a run that does not exist has no epoch to judge it in.
    ghost_run = (replace(first, runId=99), replace(second, runId=99))
    proof_reverts(w, equivocation(w, a, *ghost_run), "UnknownRun", 99)
    # Slashed once: a second equivocation of the same key finds nothing to take.
    w.prove(equivocation(w, a, first, second))
    third = replace(first, outputDigest=keccak(text="a third output"))
    proof_reverts(w, equivocation(w, a, first, third), "AlreadySlashed", a.address)


def test_disputes_takes_no_stray_ether_and_owes_nobody_by_default(world: World) -> None:
    w = world
    transfer = PlainTransfer(w.w3, w.disputes.address)
    for sender in (w.stranger, w.deployer):
        reverts(w, transfer, sender, "UnexpectedPayment", sender, value=1)
    reverts(w, w.disputes.functions.withdrawCredit(), w.stranger, "NothingToWithdraw", w.stranger)
    assert w.balance(w.disputes.address) == 0


# ---------------------------------------------------------------- coverage of the ABIs

# Errors in the three ABIs that no public call can trigger, with the reason. Keep it short.
UNREACHABLE = {
    # OpenZeppelin's ShortStrings, used only by the EIP712 constructor with constant names:
    "InvalidShortString": "thrown only for a corrupt ShortString; EIP712 builds them from consts",
    "StringTooLong": "EIP712 short-encodes only names under 32 bytes, the rest go to storage",
    # Reachable, but only after 4,096 juror nodes (many minutes on eth-tester); the bound keeps
    # a seat's search of the draw tree at 13 reads.
    "JuryFull": "needs MAX_JURORS (4,096) juror nodes to register",
    # A uint96 deposit holds 79 billion ETH: more than there is.
    "DepositOverflow": "a juror deposit above 2^96 wei needs more ETH than exists",
    # OpenZeppelin's Checkpoints: the court pushes every checkpoint at block.number, which
    # never decreases.
    "CheckpointUnorderedInsertion": "the court's checkpoint keys are block numbers, in order",
}


def deployed_error_names() -> dict[str, set[str]]:
    """Error name -> the deployed contracts whose ABI declares it."""
    artifacts = load_artifacts()
    names: dict[str, set[str]] = {}
    for contract in DEPLOYED:
        for entry in artifacts.get(contract).abi:
            if entry.get("type") == "error":
                names.setdefault(entry["name"], set()).add(contract)
    return names


def test_every_custom_error_is_named_by_some_test() -> None:
    """A coverage check: every error of the deployed contracts' ABIs appears as a string in a
    test of this folder (the tests above assert each by name and arguments), so a new revert
    path cannot ship untested. The unreachable list must name errors that exist."""
    sources = "\n".join(
        path.read_text() for path in sorted(Path(__file__).parent.glob("test_*.py"))
    )
    names = deployed_error_names()
    missing = sorted(
        f"{name} ({', '.join(sorted(contracts))})"
        for name, contracts in names.items()
        if name not in UNREACHABLE and not re.search(rf"[\"']{re.escape(name)}[\"']", sources)
    )
    assert not missing, f"custom errors that no test triggers: {missing}"
    stale = sorted(name for name in UNREACHABLE if name not in names)
    assert not stale, f"listed as unreachable but in no ABI: {stale}"
