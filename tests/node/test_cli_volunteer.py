"""A volunteer's and a sponsor's commands through the real entry point on the devnet: every
result as JSON (wei beside ETH, checksummed addresses, base58 peer ids), every refusal one line
with its exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from web3 import Web3

from gwtf.node.chain.adapter import advance_time
from gwtf.node.chain.wallet import create_wallet, import_key, node_key_path, open_wallet
from gwtf.node.home import DEFAULT_NODE_NAME, RunningNode, write_running
from gwtf.node.store.database import open_database
from tests.api.conftest import fill
from tests.node.conftest import FAST_SCRYPT_N
from tests.node.test_cli import PASSWORD, assert_one_line_error, run_cli

ETH = 10**18
WEEK_S = 7 * 24 * 3600


def new_wallet(tmp_path: Path, name: str) -> tuple[tuple[str, ...], str]:
    path = tmp_path / f"{name}.json"
    account = create_wallet(path, PASSWORD, scrypt_n=FAST_SCRYPT_N)
    (tmp_path / f"{name}.password").write_text(PASSWORD)
    return ("--wallet", str(path), "--password-file", str(tmp_path / f"{name}.password")), str(
        account.address
    )


def cheapen_node_key(wallet: tuple[str, ...]) -> None:
    """The node key ``register`` made (at the default scrypt cost), kept but encrypted again at
    the tests' low cost: each later command opens it, ~0.7 s each at the default cost."""
    path = node_key_path(wallet[wallet.index("--wallet") + 1], DEFAULT_NODE_NAME)
    key = open_wallet(path, PASSWORD).key
    path.unlink()
    import_key(path, key, PASSWORD, scrypt_n=FAST_SCRYPT_N)


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_a_volunteer_registers_with_measured_capacity_stakes_more_unstakes_and_withdraws(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, rpc_w3: Web3, tmp_path: Path
) -> None:
    chain = ("--devnet-file", str(devnet_file))
    wallet, address = new_wallet(tmp_path, "volunteer")
    run_cli(capsys, *chain, "fund", "--to", address, "--eth", "10")
    registered = cli_json(capsys, *chain, "register", *wallet, "--stake-eth", "2")
    assert isinstance(registered, dict)
    cheapen_node_key(wallet)
    capacity = registered["capacity"]
    # Measured on this machine: no GPU here, so the CPU, its RAM and a benchmarked throughput.
    assert capacity["gpu_model"].startswith(("cpu", "NVIDIA")) and capacity["memory_mib"] > 0
    assert capacity["microbatches_per_hour"] > 0
    assert registered["stake"] == {"wei": str(2 * ETH), "eth": "2"}
    assert Web3.is_checksum_address(registered["node"]) and registered["peer_id"].startswith("16U")
    code, _, err = run_cli(capsys, *chain, "register", *wallet, "--stake-eth", "2")
    assert code == 3
    assert_one_line_error(err, "NodeAlreadyRegistered(")
    status = cli_json(capsys, *chain, "status", "--wallet", wallet[1], "--api-port", "1")
    assert isinstance(status, dict) and status["node"]["status"] == "active"
    assert status["live"] is None and "no node answers" in status["live_error"]
    added = cli_json(capsys, *chain, "stake", "add", *wallet, "--eth", "0.5")
    assert isinstance(added, dict) and added["stake"]["eth"] == "2.5"
    code, _, err = run_cli(capsys, *chain, "withdraw", *wallet)
    assert code == 3
    assert_one_line_error(err, "NodeNotUnbonding(")
    unstaked = cli_json(capsys, *chain, "unstake", *wallet)
    assert isinstance(unstaked, dict) and unstaked["unlock_at"] > 0
    code, _, err = run_cli(capsys, *chain, "withdraw", *wallet)
    assert code == 3
    assert_one_line_error(err, "StakeStillLocked(")
    advance_time(rpc_w3, WEEK_S + 1)
    before = rpc_w3.eth.get_balance(address)
    withdrawn = cli_json(capsys, *chain, "withdraw", *wallet)
    assert isinstance(withdrawn, dict) and withdrawn["withdrawn"]["wei"] == str(25 * ETH // 10)
    assert rpc_w3.eth.get_balance(address) > before + 2 * ETH  # less gas
    status = cli_json(capsys, *chain, "status", "--wallet", wallet[1], "--api-port", "1")
    assert isinstance(status, dict) and status["node"]["status"] == "withdrawn"


def test_a_sponsor_opens_funds_closes_and_refunds_a_run(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, rpc_w3: Web3, tmp_path: Path
) -> None:
    chain = ("--devnet-file", str(devnet_file))
    wallet, address = new_wallet(tmp_path, "sponsor")
    run_cli(capsys, *chain, "fund", "--to", address, "--eth", "20")
    opened = cli_json(capsys, *chain, "runs", "open", *wallet, "--stages", "2",
                      "--reward-per-epoch-eth", "1", "--hop-price-eth", "0.0001",
                      "--min-stake-eth", "1", "--fund-eth", "5",
                      "--epoch-length-s", "600", "--challenge-window-s", "600")  # fmt: skip
    assert isinstance(opened, dict) and opened["sponsor"] == address and opened["open"]
    run_id = opened["run_id"]
    assert opened["pool"]["eth"] == "5"
    listed = cli_json(capsys, *chain, "runs", "list")
    assert isinstance(listed, list) and run_id in [r["run_id"] for r in listed]
    funded = cli_json(capsys, *chain, "runs", "fund", *wallet, "--run", str(run_id), "--eth", "2")
    assert isinstance(funded, dict) and funded["pool"]["eth"] == "7"
    stranger, stranger_address = new_wallet(tmp_path, "stranger")
    run_cli(capsys, *chain, "fund", "--to", stranger_address, "--eth", "1")
    code, _, err = run_cli(capsys, *chain, "runs", "close", *stranger, "--run", str(run_id))
    assert code == 3
    assert_one_line_error(err, "NotSponsor(")
    closed = cli_json(capsys, *chain, "runs", "close", *wallet, "--run", str(run_id))
    assert isinstance(closed, dict) and not closed["open"]
    code, _, err = run_cli(capsys, *chain, "runs", "refund", *wallet, "--run", str(run_id))
    assert code == 3
    assert_one_line_error(err, "RefundNotYet(")
    advance_time(rpc_w3, 100 * 24 * 3600)  # past the last epoch's claim period
    refunded = cli_json(capsys, *chain, "runs", "refund", *wallet, "--run", str(run_id))
    assert isinstance(refunded, dict) and refunded["pool"]["wei"] == "0"
    code, _, err = run_cli(capsys, *chain, "runs", "open", *wallet, "--stages", "2",
                           "--model", "gpt-huge", "--reward-per-epoch-eth", "1",
                           "--hop-price-eth", "0.0001",
                           "--min-stake-eth", "1", "--fund-eth", "1")  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "--model gpt-huge")


def test_receipts_and_earnings_read_the_node_database_beside_the_chain(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'node.sqlite'}"
    db = open_database(url)
    fill(db)
    db.close()
    from tests.api.conftest import NODE

    page = cli_json(capsys, "receipts", "--run", "1", "--node", NODE.address, "--db-url", url,
                    "--limit", "5")  # fmt: skip
    assert isinstance(page, dict) and page["total"] == 12 and len(page["items"]) == 5
    code, out, _ = run_cli(capsys, "receipts", "--run", "1", "--node", NODE.address,
                           "--db-url", url)  # fmt: skip
    assert code == 0 and "receipts 1-12 of 12" in out
    code, _, err = run_cli(capsys, "receipts", "--run", "1", "--node", NODE.address,
                           "--db-url", f"sqlite:///{tmp_path / 'none.sqlite'}")  # fmt: skip
    assert code == 1
    assert_one_line_error(err, "no node database at")
    code, _, err = run_cli(capsys, "earnings", "--node", NODE.address, "--db-url", url)
    assert code == 2
    assert_one_line_error(err, "say which run")


def test_claim_without_a_running_node_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    code, _, err = run_cli(capsys, "claim", "--home", str(home))
    assert code == 8
    assert_one_line_error(err, f"no node runs in {home}")
    # A node killed without its goodbye leaves its file: a process that is gone is no node.
    write_running(home, RunningNode("0x" + "11" * 20, "peer", 1, "relay", "http://x", "", 2**22))
    code, _, err = run_cli(capsys, "claim", "--home", str(home))
    assert code == 8
    assert_one_line_error(err, f"no node runs in {home}")
    code, _, err = run_cli(capsys, "claim", "--home", str(home), "--api-port", "1")
    assert code == 2
    assert_one_line_error(err, "no API token")
    (home / "api-token").write_text("x" * 40)
    code, _, err = run_cli(capsys, "claim", "--home", str(home), "--api-port", "1", "--all")
    assert code == 8
    assert_one_line_error(err, "no node answers at http://127.0.0.1:1")


def test_every_command_takes_json_and_the_simple_ones_answer_in_it(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, tmp_path: Path
) -> None:
    from gwtf.node.cli.main import build_parser

    parser, _ = build_parser()
    leaves = []

    def walk(p: object, name: str) -> None:
        import argparse

        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]  # type: ignore[attr-defined]
        if not subs:
            leaves.append((name, p))
        for action in subs:
            for child_name, child in action.choices.items():
                walk(child, f"{name} {child_name}".strip())

    walk(parser, "")
    assert len(leaves) > 20
    for name, leaf in leaves:
        assert any("--json" in a.option_strings for a in leaf._actions), name  # type: ignore[attr-defined]
    wallet, address = new_wallet(tmp_path, "json")
    shown = cli_json(capsys, "wallet", "address", "--wallet", wallet[1])
    assert shown == {"address": address, "path": wallet[1]}
    sent = cli_json(capsys, "--devnet-file", str(devnet_file), "fund", "--to", address,
                    "--eth", "1.5")  # fmt: skip
    assert isinstance(sent, dict) and sent["sent"] == {"wei": str(15 * ETH // 10), "eth": "1.5"}
    # (The demo's --json report is tests/node/test_demo.py's.)


MONEY = ("--reward-per-epoch-eth", "1", "--hop-price-eth", "0.0001", "--min-stake-eth", "1",
         "--fund-eth", "1")  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("receipts", "--node", "0x" + "ab" * 20, "--epoch", "9" * 40), "out of range"),
        (("receipts", "--node", "0x" + "ab" * 20, "--limit", "0"), "1 or more"),
        (("runs", "close", "--run", "-1", "--wallet", "w.json"), "out of range"),
        (("runs", "add-data-node", "--run", "1", "--node", "bob", "--wallet", "w"), "not an addr"),
        (("earnings", "--node", "0x12", "--run", "1"), "not an address"),
        (("start", "--wallet", "w", "--run", "1", "--api-port", "70000"), "port number"),
        (("status", "--api-port", "x"), "not a port number"),
        (("runs", "open", "--wallet", "w", "--stages", "70000", *MONEY), "stages 1..65535"),
        (("register", "--wallet", "w", "--stake-eth", "1e40"), "more than the contracts hold"),
        (("fund", "--to", "0x12"), "not an address"),
    ],
)
def test_a_flag_out_of_its_range_is_a_usage_error_naming_it(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], says: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_cli(capsys, *argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and says in err and "Traceback" not in err


def test_a_database_url_in_an_error_never_shows_its_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "nosuchdb://operator:hunter2-secret@db.example/node"
    code, _, err = run_cli(capsys, "earnings", "--node", "0x" + "ab" * 20, "--run", "1",
                           "--db-url", url)  # fmt: skip
    assert code != 0 and "hunter2" not in err
    assert_one_line_error(err, "operator:***@db.example")
