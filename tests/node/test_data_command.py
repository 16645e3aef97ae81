"""`gwtf-node data prepare|verify` and `runs open --data` on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwtf.errors import ConfigError
from gwtf.node.cli.main import main


def corpus(folder: Path) -> Path:
    folder.mkdir()
    lines = [json.dumps({"text": f"document {i}: " + "word " * (i % 17 + 3)}) for i in range(300)]
    (folder / "docs.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_prepare_writes_a_data_set_and_verify_checks_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = corpus(tmp_path / "corpus")
    out = tmp_path / "set"
    args = [
        "data",
        "prepare",
        str(source),
        "--out",
        str(out),
        "--train-tokenizer",
        "300",
        "--val-fraction",
        "0.1",
    ]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["vocab_size"] == 300 and summary["tokenizer"] == "trained"
    assert summary["files_read"] == 1 and summary["val_tokens"] > 0
    assert main([*args]) == 0  # again: nothing to read, the same data set
    assert "0 files read, 1 already prepared" in " ".join(capsys.readouterr().out.split())
    assert main(["data", "verify", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dataset_hash"] == summary["dataset_hash"]


def test_a_bad_corpus_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = corpus(tmp_path / "corpus")
    code = main(
        [
            "data",
            "prepare",
            str(source / "docs.jsonl"),
            "--out",
            str(tmp_path / "set"),
            "--field",
            "body",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert f"{source / 'docs.jsonl'}:1: no text field 'body'" in err


def test_a_run_opened_with_a_data_set_commits_to_its_manifest_hash(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, tmp_path: Path
) -> None:
    from gwtf.node.chain.actions import open_contracts
    from gwtf.node.settings import load_settings
    from tests.node.test_cli_volunteer import cli_json, new_wallet

    source = corpus(tmp_path / "corpus")
    prepared = cli_json(capsys, "data", "prepare", str(source), "--out", str(tmp_path / "set"),
                        "--val-fraction", "0.1", "--train-tokenizer", "300")  # fmt: skip
    assert isinstance(prepared, dict) and prepared["vocab_size"] != 256
    chain = ("--devnet-file", str(devnet_file))
    wallet, address = new_wallet(tmp_path, "sponsor")
    cli_json(capsys, *chain, "fund", "--to", address, "--eth", "5")
    opened = cli_json(capsys, *chain, "runs", "open", *wallet, "--stages", "2",
                      "--data", str(tmp_path / "set"), "--reward-per-epoch-eth", "1",
                      "--hop-price-eth", "0.0001", "--min-stake-eth", "1",
                      "--fund-eth", "1")  # fmt: skip
    assert isinstance(opened, dict)
    settings = load_settings({"chain.devnet_file": str(devnet_file)}, env={})
    contracts, _ = open_contracts(settings)
    run = contracts.ledger.functions.getRun(opened["run_id"]).call()
    assert "0x" + run[12].hex() == prepared["dataset_hash"]
    # The run commits to the data set and to the model it sizes (its vocabulary): the chain
    # says both, and a data node, ``start`` and ``export`` refuse another data set.
    from gwtf.node.chain.actions import RunModel, check_run_dataset
    from gwtf.node.composition import run_dataset_hash
    from gwtf.node.training.settings import TrainingSettings

    info = contracts.port().run_info(opened["run_id"])
    assert info is not None and "0x" + info.dataset_hash.hex() == prepared["dataset_hash"]
    relay = TrainingSettings(stages=2, vocab_size=prepared["vocab_size"])  # no data set
    assert RunModel.of(relay).config_hash == info.model_config_hash
    assert RunModel.of(TrainingSettings(stages=2)).config_hash != info.model_config_hash
    with pytest.raises(ConfigError, match=f"trains on data set {prepared['dataset_hash']}"):
        check_run_dataset(opened["run_id"], info.dataset_hash, "")
    check_run_dataset(opened["run_id"], info.dataset_hash, str(tmp_path / "set"))
    node = {
        "chain.devnet_file": str(devnet_file),
        "chain.run_id": opened["run_id"],
        "chain.admission": True,
        "node.role": "data",
        "node.stage": 0,
    }
    data_node = load_settings({**node, "training.data": str(tmp_path / "set")}, env={})
    assert run_dataset_hash(data_node) == info.dataset_hash.hex()
    with pytest.raises(ConfigError, match=r"not on the shipped corpus; set training\.data"):
        run_dataset_hash(load_settings(node, env={}))
