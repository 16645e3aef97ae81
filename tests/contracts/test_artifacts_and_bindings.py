"""The artifacts file is current and well-formed; ``deploy_suite`` deploys and wires the three
contracts; ``find_certificate`` reads a submitted certificate back from its event; and reverts
of every contract decode into the custom error with its arguments, from eth-tester and from
JSON-RPC shaped exceptions alike."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eth_abi.abi import encode
from eth_tester.exceptions import TransactionFailed
from eth_utils.address import to_checksum_address
from web3.exceptions import ContractCustomError, ContractLogicError

from gwtf.contracts import artifacts as artifacts_module
from gwtf.contracts import fraud_proofs
from gwtf.contracts.artifacts import (
    ARTIFACTS_PATH,
    REBUILD_HINT,
    load_artifacts,
    read_artifacts,
    sources_sha256,
)
from gwtf.contracts.bindings import (
    HINTS,
    ContractRevert,
    SuiteParams,
    all_errors_abi,
    attach,
    call,
    decode_revert,
    deploy_suite,
    error_selector,
    error_signature,
    find_certificate,
    transact,
)
from gwtf.errors import ChainError
from tests.contracts.conftest import TEST_PARAMS, Certified
from tests.contracts.world import ETH, World

ROOT = Path(__file__).resolve().parents[2]
DEPLOYED = ("NodeRegistry", "WorkLedger", "Disputes", "Court")
EIP170_MAX_CODE_BYTES = 24_576
#: Room each deployed contract keeps below EIP-170, so that a further proof or a compiler
#: change still deploys.
HEADROOM_BYTES = 2_048


# ---------------------------------------------------------------- artifacts


def test_artifacts_were_rebuilt_after_the_last_source_change() -> None:
    stored = json.loads(ARTIFACTS_PATH.read_text())["sourcesSha256"]
    assert stored == sources_sha256(), (
        "a .sol source changed: run `make contracts` and commit artifacts.json"
    )


def test_artifacts_record_the_pinned_compiler_and_fork() -> None:
    artifacts = load_artifacts()
    pinned = json.loads((ROOT / "package.json").read_text())["dependencies"]["solc"]
    assert artifacts.compiler.startswith(pinned + "+commit")
    assert artifacts.evm_version == "prague"
    # HopRules is deployed by the Disputes constructor.
    assert set(artifacts.contracts) == {*DEPLOYED, "HopRules", "MerkleProbe", "ReentrantWallet"}
    for name in DEPLOYED:
        compiled = artifacts.get(name)
        assert compiled.bytecode and any(entry["type"] == "constructor" for entry in compiled.abi)


def test_deployed_code_fits_eip_170_with_room_to_spare(world: World) -> None:
    addresses = dict(world.suite.addresses)
    addresses["HopRules"] = world.disputes.functions.hopRules().call()
    for name, address in addresses.items():
        size = len(world.w3.eth.get_code(to_checksum_address(address)))
        assert 0 < size <= EIP170_MAX_CODE_BYTES - HEADROOM_BYTES, (name, size)


def test_the_hash_notices_an_edited_or_added_source(tmp_path: Path) -> None:
    contracts_dir = tmp_path / "contracts"
    (contracts_dir / "test").mkdir(parents=True)
    (contracts_dir / "A.sol").write_text("contract A {}")
    (contracts_dir / "test" / "B.sol").write_text("contract B {}")
    before = sources_sha256(contracts_dir)
    (contracts_dir / "test" / "B.sol").write_text("contract B { }")
    edited = sources_sha256(contracts_dir)
    (contracts_dir / "C.sol").write_text("")
    added = sources_sha256(contracts_dir)
    assert len({before, edited, added}) == 3


def test_stale_artifacts_are_refused_before_anything_is_deployed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(artifacts_module, "sources_sha256", lambda: "0" * 64)
    with pytest.raises(ChainError, match=re.escape(REBUILD_HINT)):
        load_artifacts.__wrapped__()
    # Without the check (an installed wheel has no sources) the file is still readable.
    assert load_artifacts.__wrapped__(check_fresh=False).contracts


def test_missing_or_broken_artifacts_say_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ChainError, match=re.escape("run `make contracts`")):
        read_artifacts(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"contracts": {}}')
    with pytest.raises(ChainError, match="missing or stale"):
        read_artifacts(broken)
    with pytest.raises(ChainError, match="not in the artifacts"):
        load_artifacts().get("NoSuchContract")


# ---------------------------------------------------------------- deployment


def test_deploy_suite_deploys_four_contracts_wired_together(world: World) -> None:
    w, suite = world, world.suite
    assert suite.addresses == {
        "NodeRegistry": suite.registry.address,
        "WorkLedger": suite.ledger.address,
        "Disputes": suite.disputes.address,
        "Court": suite.court.address,
    }
    assert len(set(suite.addresses.values())) == 4
    # The court takes cases from the disputes contract only, which knows it.
    assert w.call(suite.court.functions.arbitrable()) == suite.disputes.address
    assert w.call(suite.disputes.functions.court()) == suite.court.address
    assert w.call(suite.court.functions.registry()) == suite.registry.address
    assert w.call(suite.court.functions.owner()) == w.deployer
    registry, ledger, disputes = (
        c.functions for c in (suite.registry, suite.ledger, suite.disputes)
    )
    # The disputes contract is the registry's only slasher and the ledger's only voider.
    assert w.call(registry.slasher()) == suite.disputes.address
    assert w.call(ledger.disputes()) == suite.disputes.address
    assert w.call(ledger.registry()) == suite.registry.address
    assert w.call(disputes.registry()) == suite.registry.address
    assert w.call(disputes.ledger()) == suite.ledger.address
    assert w.call(registry.owner()) == w.call(ledger.owner()) == w.deployer
    assert w.call(registry.minStakeWei()) == TEST_PARAMS.min_stake_wei
    assert w.call(registry.unbondingDelayS()) == TEST_PARAMS.unbonding_delay_s
    assert w.call(disputes.bountyBps()) == TEST_PARAMS.bounty_bps
    # Nothing is held yet.
    assert all(w.balance(address) == 0 for address in suite.addresses.values())


def test_deploy_suite_takes_its_parameters_and_reports_constructor_reverts(world: World) -> None:
    w = world
    params = SuiteParams(min_stake_wei=3 * ETH, unbonding_delay_s=99_000, bounty_bps=1_000)
    other = deploy_suite(w.w3, w.stranger, params)
    assert other.addresses != w.suite.addresses
    assert w.call(other.registry.functions.minStakeWei()) == 3 * ETH
    assert w.call(other.registry.functions.unbondingDelayS()) == 99_000
    assert w.call(other.disputes.functions.bountyBps()) == 1_000
    assert w.call(other.ledger.functions.owner()) == w.stranger
    assert w.call(other.registry.functions.slasher()) == other.disputes.address
    with pytest.raises(ContractRevert) as excinfo:
        deploy_suite(w.w3, w.stranger, SuiteParams(bounty_bps=1_001))
    assert (excinfo.value.name, excinfo.value.args) == ("BountyOutOfRange", (1_001, 1_000))
    with pytest.raises(ContractRevert) as excinfo:
        deploy_suite(w.w3, w.stranger, SuiteParams(unbonding_delay_s=0))
    assert (excinfo.value.name, excinfo.value.args) == ("ZeroUnbondingDelay", ())


def test_attach_reads_a_deployed_contract(world: World) -> None:
    for name, address in world.suite.addresses.items():
        attached = attach(world.w3, name, address.lower())
        assert attached.address == address
    ledger = attach(world.w3, "WorkLedger", world.ledger.address)
    assert world.call(ledger.functions.runCount()) == 0


# ---------------------------------------------------------------- certificates


def test_find_certificate_reads_back_what_was_submitted(certified: Certified) -> None:
    c = certified
    w, run, data = c.w, c.run, c.data.address
    found = find_certificate(w.ledger, run, 0, data)
    assert found is not None and found == c.cert
    assert found.commitment() == w.call(w.ledger.functions.certificateCommitment(run, 0, data))
    assert find_certificate(w.ledger, run, 1, data) is None
    assert find_certificate(w.ledger, run, 0, c.a.address) is None
    assert find_certificate(w.ledger, run + 1, 0, data) is None
    # The same data node's certificate of the same epoch of another run is told apart.
    other = w.open_run()
    w.add_data_node(other, c.data)
    tree = w.certificate_tree(w.pipeline_hops(other, 0, c.data, [c.a, c.b], range(1)))
    other_cert = w.certify(tree, other, 0, c.data)
    assert other_cert.root != c.cert.root
    assert find_certificate(w.ledger, other, 0, data) == other_cert
    assert find_certificate(w.ledger, run, 0, data) == c.cert


# ---------------------------------------------------------------- revert decoding


def custom_error_data(signature: str, types: list[str], values: list[object]) -> bytes:
    return error_selector(signature) + encode(types, values)


ADDRESS = "0x" + "ab" * 20
CHECKSUMMED = "0xABaBaBaBABabABabAbAbABAbABabababaBaBABaB"
STAKE_DATA = custom_error_data(
    "InsufficientStake(address,uint256,uint256)",
    ["address", "uint256", "uint256"],
    [ADDRESS, 5, 10],
)


@pytest.mark.parametrize(
    "exc",
    [
        TransactionFailed("execution reverted: " + repr(STAKE_DATA)),  # web3's eth-tester provider
        TransactionFailed(STAKE_DATA),  # eth-tester directly
        ContractCustomError("execution reverted", data="0x" + STAKE_DATA.hex()),  # JSON-RPC
        ContractLogicError("execution reverted", data={"data": "0x" + STAKE_DATA.hex()}),
    ],
    ids=["tester-provider", "tester", "rpc-custom", "rpc-dict"],
)
def test_decode_revert_reads_custom_errors_from_every_source(exc: Exception) -> None:
    revert = decode_revert(exc, all_errors_abi())
    assert (revert.name, revert.args) == ("InsufficientStake", (CHECKSUMMED, 5, 10))
    assert isinstance(revert, ChainError)
    assert "\n" not in str(revert) and "send at least the minimum stake" in str(revert)


def test_decode_revert_handles_strings_panics_and_unknown_errors() -> None:
    reason = bytes.fromhex("08c379a0") + encode(["string"], ["nope"])
    assert decode_revert(ContractLogicError("x", data="0x" + reason.hex()), []).args == ("nope",)
    assert decode_revert(TransactionFailed("execution reverted: plain words"), []).args == (
        "plain words",
    )
    panic = bytes.fromhex("4e487b71") + encode(["uint256"], [0x11])
    decoded = decode_revert(TransactionFailed(panic), [])
    assert (decoded.name, decoded.args) == ("Panic", (0x11,))
    unknown = decode_revert(TransactionFailed(b"\xde\xad\xbe\xef"), all_errors_abi())
    assert (unknown.name, unknown.args) == ("UnknownError", ("0xdeadbeef",))
    truncated = decode_revert(TransactionFailed(STAKE_DATA[:20]), all_errors_abi())
    assert truncated.name == "UnknownError"


def sample(kind: str, salt: int) -> Any:
    """A value of ABI type ``kind`` (the types the suite's errors use)."""
    if kind == "address":
        return to_checksum_address(f"0x{salt + 1:040x}")
    if kind.startswith("uint"):
        return (1 << int(kind[4:])) - 1 - salt
    if kind == "bytes32":
        return bytes([salt + 1]) * 32
    if kind == "bytes":
        return bytes(range(salt + 3))
    if kind == "string":
        return f"text {salt}"
    raise AssertionError(f"add a sample for {kind}")


def deployed_errors() -> list[tuple[str, dict[str, Any]]]:
    return [
        (contract, entry)
        for contract in DEPLOYED
        # Read without the freshness check: a stale file fails its own test, not collection.
        for entry in read_artifacts().get(contract).abi
        if entry["type"] == "error"
    ]


@pytest.mark.parametrize(
    ("contract", "entry"),
    deployed_errors(),
    ids=[f"{contract}.{error_signature(entry)}" for contract, entry in deployed_errors()],
)
def test_every_error_of_every_contract_decodes_with_its_arguments(
    contract: str, entry: dict[str, Any]
) -> None:
    types = [item["type"] for item in entry["inputs"]]
    values = [sample(kind, i) for i, kind in enumerate(types)]
    data = custom_error_data(error_signature(entry), types, values)
    for exc in (TransactionFailed(data), ContractLogicError("reverted", data="0x" + data.hex())):
        revert = decode_revert(exc, all_errors_abi())
        assert (revert.name, revert.args, revert.data) == (entry["name"], tuple(values), data)


def test_error_selectors_are_unambiguous_across_the_suite() -> None:
    """Errors that share a name across contracts either share the signature (one decoding) or
    differ in arguments and so in selector; no two signatures share a selector."""
    by_selector: dict[bytes, set[str]] = {}
    for _, entry in deployed_errors():
        by_selector.setdefault(error_selector(error_signature(entry)), set()).add(
            error_signature(entry)
        )
    assert all(len(signatures) == 1 for signatures in by_selector.values()), by_selector
    # RunBook's NodeNotActive(address) and the registry's NodeNotActive(address,uint8) both
    # decode, each with its own arguments.
    variants: list[tuple[str, list[str], list[object]]] = [
        ("NodeNotActive(address)", ["address"], [CHECKSUMMED]),
        ("NodeNotActive(address,uint8)", ["address", "uint8"], [CHECKSUMMED, 2]),
    ]
    for signature, types, values in variants:
        data = custom_error_data(signature, types, values)
        revert = decode_revert(TransactionFailed(data), all_errors_abi())
        assert (revert.name, revert.args) == ("NodeNotActive", tuple(values))


def test_every_hint_names_an_error_of_the_suite() -> None:
    names = {entry["name"] for _, entry in deployed_errors()}
    assert sorted(set(HINTS) - names) == []


@pytest.mark.parametrize(
    ("contract", "build", "expected"),
    [
        (
            "NodeRegistry",
            lambda w: w.registry.functions.slash(w.key("ghost").address),
            lambda w: ("NotSlasher", (w.stranger,)),
        ),
        ("WorkLedger", lambda w: w.ledger.functions.fundRun(42), lambda w: ("UnknownRun", (42,))),
        (
            "Disputes",
            lambda w: w.disputes.functions.withdrawCredit(),
            lambda w: ("NothingToWithdraw", (w.stranger,)),
        ),
        (
            "Court",
            lambda w: w.court.functions.executeRuling(7),
            lambda w: ("WrongPhase", (7, 0)),
        ),
    ],
    ids=DEPLOYED,
)
def test_transact_and_call_decode_reverts_of_every_contract(
    world: World, contract: str, build: Any, expected: Any
) -> None:
    """Without a gas limit the revert surfaces at estimation; with one the failed transaction
    is mined and replayed for its reason; a call decodes it too. All give the same error."""
    w = world
    fn = build(w)
    outcomes = []
    for gas in (None, 500_000):
        with pytest.raises(ContractRevert) as excinfo:
            transact(w.w3, fn, w.stranger, 1 if contract == "WorkLedger" else 0, gas=gas)
        outcomes.append((excinfo.value.name, excinfo.value.args))
    with pytest.raises(ContractRevert) as excinfo:
        call(fn, w.stranger)
    outcomes.append((excinfo.value.name, excinfo.value.args))
    assert outcomes == [expected(w)] * 3


def test_a_revert_deep_in_a_call_chain_decodes_as_the_innermost_error(
    certified: Certified,
) -> None:
    """Disputes calls the ledger, which reverts: the ledger's error comes through unchanged."""
    c = certified
    w = c.w
    unsubmitted = replace(c.cert, dataNode=c.b.address)
    proof = fraud_proofs.bad_totals(unsubmitted, c.tree.leaf_proof(0))
    salt = w.commit(proof, w.challenger)
    with pytest.raises(ContractRevert) as excinfo:
        w.tx(w.reveal_fn(proof, salt), w.challenger)
    assert (excinfo.value.name, excinfo.value.args) == (
        "CertificateNotOpen",
        (c.run, 0, c.b.address),
    )
