"""`gwtf-node`: each bad input is one line on stderr with the documented exit code; no traceback."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from eth_account import Account

from gwtf.node.chain.actions import Contracts, RunConfig, open_run
from gwtf.node.chain.adapter import Sender
from gwtf.node.chain.wallet import create_wallet, load_or_create_node_key, node_key_path
from gwtf.node.cli.main import main
from gwtf.node.devnet.server import RunningDevnet
from gwtf.node.home import DEFAULT_NODE_NAME
from tests.node.conftest import FAST_SCRYPT_N

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "volunteer-password"
ETH = 10**18


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gwtf-node: error: ")
    assert fragment in lines[0]
    assert "Traceback" not in err


@pytest.fixture
def wallet(tmp_path: Path) -> tuple[Path, Path, str]:
    """A wallet, and its node key made as ``register`` would make it but at the tests' low
    scrypt cost (~0.7 s for each command that opens it at the default cost); that ``register``
    makes the key itself is tests/node/test_cli_volunteer.py's to check."""
    path = tmp_path / "wallet.json"
    account = create_wallet(path, PASSWORD, scrypt_n=FAST_SCRYPT_N)
    node_key = node_key_path(path, DEFAULT_NODE_NAME)
    load_or_create_node_key(node_key, PASSWORD, scrypt_n=FAST_SCRYPT_N)
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    return path, password_file, account.address


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_wrong_password_exits_4(
    capsys: pytest.CaptureFixture[str], wallet: tuple[Path, Path, str], devnet_file: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    path, _, _ = wallet
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it")
    code, _, err = run_cli(
        capsys, "--devnet-file", str(devnet_file), "register", "--wallet", str(path),
        "--password-file", str(wrong), "--stake-eth", "2",
    )  # fmt: skip
    assert code == 4
    assert_one_line_error(err, "wrong password for wallet")


def test_unfunded_wallet_exits_4_then_fund_and_register_succeed(
    capsys: pytest.CaptureFixture[str], wallet: tuple[Path, Path, str], devnet_file: Path
) -> None:
    path, password_file, address = wallet
    register = ("--devnet-file", str(devnet_file), "register", "--wallet", str(path),
                "--password-file", str(password_file), "--stake-eth", "2")  # fmt: skip
    code, _, err = run_cli(capsys, *register)
    assert code == 4
    assert_one_line_error(err, f"wallet {address} holds 0 ETH")
    code, out, _ = run_cli(capsys, "--devnet-file", str(devnet_file), "fund", "--to", address,
                           "--eth", "3")  # fmt: skip
    assert code == 0 and "it now holds 3" in out
    code, out, err = run_cli(capsys, *register)
    assert code == 0, err
    text = " ".join(out.split())  # rich wraps long lines
    assert "registered node" in text and "with 2 ETH stake" in text and "(peer id 16Uiu2" in text


def test_revert_exits_3_with_the_contract_error(
    capsys: pytest.CaptureFixture[str], wallet: tuple[Path, Path, str], devnet_file: Path
) -> None:
    path, password_file, address = wallet
    run_cli(capsys, "--devnet-file", str(devnet_file), "fund", "--to", address, "--eth", "3")
    code, _, err = run_cli(
        capsys, "--devnet-file", str(devnet_file), "register", "--wallet", str(path),
        "--password-file", str(password_file), "--stake-eth", "0.1",
    )  # fmt: skip
    assert code == 3
    assert_one_line_error(err, "InsufficientStake(")
    assert "send at least the minimum stake" in err


def test_join_and_info_read_back_the_chain(
    capsys: pytest.CaptureFixture[str],
    wallet: tuple[Path, Path, str],
    devnet_file: Path,
    rpc_contracts: Contracts,
) -> None:
    path, password_file, address = wallet
    flags = ("--wallet", str(path), "--password-file", str(password_file))
    chain = ("--devnet-file", str(devnet_file))
    run_cli(capsys, *chain, "fund", "--to", address, "--eth", "5")
    assert run_cli(capsys, *chain, "register", *flags, "--stake-eth", "2")[0] == 0
    sponsor = Sender.unlocked(rpc_contracts.w3.eth.accounts[7])
    run_id = open_run(rpc_contracts, sponsor, RunConfig(b"\x01" * 32, b"\x02" * 32, 2, 600, 10,
                                                        ETH, 600, ETH, 10**14), ETH)  # fmt: skip
    code, out, err = run_cli(capsys, *chain, "join", *flags, "--run", str(run_id))
    assert code == 0, err
    node = out.split()[1]
    assert rpc_contracts.ledger.functions.isAdmitted(run_id, node).call()
    code, out, _ = run_cli(capsys, *chain, "info", "--node", node, "--run", str(run_id), "--json")
    assert code == 0
    info = json.loads(out)
    assert info["node"]["wallet"] == address and info["node"]["status"] == "active"
    assert info["node"]["stake"] == {"wei": str(2 * ETH), "eth": "2"}
    assert info["node"]["peer_id"].startswith("16Uiu2")
    assert info["run"]["run_id"] == run_id and info["run"]["open"]
    code, out, _ = run_cli(capsys, *chain, "info", "--node", node)
    assert code == 0 and "2 ETH" in out and address in out


def test_bad_settings_and_missing_devnet_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_cli(capsys, "--rpc-url", "localhost:8545", "info", "--run", "1")
    assert code == 2
    assert_one_line_error(err, "chain.rpc_url='localhost:8545' from the command line")
    code, _, err = run_cli(capsys, "--devnet-file", str(tmp_path / "none.json"), "info",
                           "--run", "1")  # fmt: skip
    assert code == 3
    assert_one_line_error(err, "no devnet file at")


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GWTF_")}
    env.update(extra)
    return env


def test_unreachable_rpc_as_a_subprocess(devnet_file: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "gwtf.node.cli", "--rpc-url", url, "--devnet-file", str(devnet_file),
         "info", "--run", "1"],
        capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 3
    assert done.stderr.strip() == (
        f"gwtf-node: error: cannot reach chain RPC at {url}; start `gwtf-node devnet` or pass "
        "--rpc-url"
    )


def test_missing_artifacts_as_a_subprocess(tmp_path: Path) -> None:
    # A copy of the gwtf package without gwtf/contracts/artifacts.json shadows the real one.
    shadow = tmp_path / "shadow" / "gwtf"
    shutil.copytree(
        REPO / "gwtf", shadow,
        ignore=shutil.ignore_patterns("artifacts.json", "__pycache__", "static"),
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "gwtf.node.cli", "--devnet-file", str(tmp_path / "d.json"), "devnet",
         "--port", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env=subprocess_env(PYTHONPATH=os.pathsep.join([str(shadow.parent), str(REPO)])),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert_one_line_error(done.stderr, "gwtf/contracts/artifacts.json is missing or stale")
    assert not (tmp_path / "d.json").exists()


def test_wallet_new_and_address_commands(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD)
    path = tmp_path / "new.json"
    code, out, _ = run_cli(capsys, "wallet", "new", "--wallet", str(path), "--password-file",
                           str(password_file))  # fmt: skip
    assert code == 0
    address = out.split()[2]
    assert Account.decrypt(path.read_text(), PASSWORD) is not None
    assert run_cli(capsys, "wallet", "address", "--wallet", str(path))[1].strip() == address
    code, _, err = run_cli(capsys, "wallet", "new", "--wallet", str(path), "--password-file",
                           str(password_file))  # fmt: skip
    assert code == 4
    assert_one_line_error(err, "already exists")
    assert PASSWORD not in out + err


def test_devnet_port_in_use_is_one_line(
    capsys: pytest.CaptureFixture[str], devnet: RunningDevnet, tmp_path: Path
) -> None:
    port = devnet.info.rpc_url.rsplit(":", 1)[1]
    code, _, err = run_cli(capsys, "--devnet-file", str(tmp_path / "d.json"), "devnet",
                           "--port", port)  # fmt: skip
    assert code == 3
    assert_one_line_error(err, f"cannot listen on 127.0.0.1:{port}")


def test_an_error_raised_inside_a_hosts_nursery_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command's GwtfError that a libp2p host's nursery wraps in an exception group exits
    with its own code and one line, like any other."""
    import gwtf.node.cli.audit
    from gwtf.errors import ChainError

    def fails(*_args: object) -> int:
        raise ExceptionGroup("nursery", [ExceptionGroup("host", [ChainError("the RPC is gone")])])

    monkeypatch.setattr(gwtf.node.cli.audit, "cmd_audit", fails)
    assert main(["audit", "--run", "1", "--epoch", "0"]) == 3
    assert capsys.readouterr().err == "gwtf-node: error: the RPC is gone\n"


def test_help_loads_none_of_the_heavy_libraries() -> None:
    """``--help`` answers without torch, web3, libp2p or rich (``bench/cli.py`` times it)."""
    probe = (
        "import sys\n"
        "from gwtf.node.cli.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('torch', 'web3', 'libp2p', 'rich', 'eth_account', 'trio', 'fastapi')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert "usage: gwtf-node" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"
