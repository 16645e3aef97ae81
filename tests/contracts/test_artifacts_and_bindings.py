"""The artifacts file is current and well-formed, and reverts decode into the contract's custom
error from both eth-tester and JSON-RPC shaped exceptions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from eth_abi.abi import encode
from eth_tester.exceptions import TransactionFailed
from web3.exceptions import ContractCustomError, ContractLogicError

from contracts.artifacts import ARTIFACTS_PATH, load_artifacts, read_artifacts, sources_sha256
from contracts.bindings import ContractRevert, all_errors_abi, call, decode_revert, error_selector
from gwtf.errors import ChainError
from tests.contracts.world import World

ROOT = Path(__file__).resolve().parents[2]


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
    assert {"NodeRegistry", "WorkLedger"} <= set(artifacts.contracts)
    # EIP-170: deployed code must stay under 24,576 bytes (init code is a little larger).
    assert len(artifacts.get("WorkLedger").bytecode) // 2 < 26_000


def test_the_hash_notices_an_edited_source(tmp_path: Path) -> None:
    contracts_dir = tmp_path / "contracts"
    (contracts_dir / "test").mkdir(parents=True)
    (contracts_dir / "A.sol").write_text("contract A {}")
    (contracts_dir / "test" / "B.sol").write_text("contract B {}")
    before = sources_sha256(contracts_dir)
    (contracts_dir / "test" / "B.sol").write_text("contract B { }")
    assert sources_sha256(contracts_dir) != before


def test_missing_or_broken_artifacts_say_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ChainError, match=re.escape("run `make contracts`")):
        read_artifacts(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"contracts": {}}')
    with pytest.raises(ChainError, match="missing or stale"):
        read_artifacts(broken)
    with pytest.raises(ChainError, match="not in the artifacts"):
        load_artifacts().get("NoSuchContract")


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


def test_transact_decodes_reverts_whether_estimated_or_mined(world: World) -> None:
    """Without a gas limit the revert surfaces at estimation; with one the failed transaction is
    mined and replayed for its reason. Both give the same ContractRevert."""
    from contracts.bindings import transact

    fn = world.ledger.functions.fundRun(42)
    for gas in (None, 500_000):
        with pytest.raises(ContractRevert) as excinfo:
            transact(world.w3, fn, world.sponsor, 1, gas=gas)
        assert (excinfo.value.name, excinfo.value.args) == ("UnknownRun", (42,))
    with pytest.raises(ContractRevert) as excinfo:
        call(fn, world.sponsor, 1)
    assert excinfo.value.name == "UnknownRun"


def test_every_custom_error_is_exercised_by_some_test() -> None:
    """Each custom error of the suite appears (quoted) in a test of this folder, so a new revert
    path cannot ship untested. Listed exceptions cannot be reached on a test chain."""
    unreachable = {
        "StakeOverflow": "needs a stake above 2**88 wei (~3e8 ETH); test accounts hold 1e6 ETH",
        "FundsOverflow": "needs a pool above 2**128 wei",
        "OwnableInvalidOwner": "OpenZeppelin's own constructor/transfer checks",
        "InvalidShortString": "OpenZeppelin EIP712 constructor; the domain names are constants",
        "StringTooLong": "idem",
        "NotOwner": "test-only ReentrantWallet",
        "PaymentRejected": "test-only ReentrantWallet, surfaced as TransferFailed",
    }
    tests_text = "\n".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py"))
    names = {entry["name"] for entry in all_errors_abi()}
    missing = sorted(n for n in names - unreachable.keys() if f'"{n}"' not in tests_text)
    assert not missing, f"custom errors without a test: {missing}"
