"""``gwtf-node export`` end to end: the devnet over JSON-RPC holds the runs and their nodes, real
libp2p hosts on 127.0.0.1 serve the parts of a model trained one step (each admitting only the
run's nodes, so the exporter is served in public), and the command runs as a person runs it.
``transformers`` loads what it writes, and the logits are the stage chain's; stages at different
steps, a missing stage, a state failing its digest, a non-empty out dir, another model and
unreachable peers are each one line with their exit code."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
import trio
from eth_account import Account

from gwtf.node.chain.actions import (
    DATASET_HASH,
    Capacity,
    Contracts,
    RunConfig,
    RunModel,
    add_data_node,
    join_run,
    model_config_hash,
    open_run,
    register_node,
)
from gwtf.node.chain.adapter import ChainPort, Sender, connect
from gwtf.node.cli.main import main
from gwtf.node.devnet.server import RunningDevnet
from gwtf.node.export import gather
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.p2p.weights import StageSnapshot, serve_weights
from gwtf.node.runtime.discovery.admission import RunAdmission
from gwtf.node.runtime.replicas.stage_state import serve_stage_state
from gwtf.node.training.checkpoint import save_part_state
from gwtf.node.training.config import named_config
from gwtf.node.training.data import MicrobatchSampler, load_default_corpus
from gwtf.node.training.local_pipeline import LocalPipeline
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.prepare import PrepareOptions, prepare
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.trainer import PartTrainer
from tests.node.conftest import TEST_GAS_LIMIT
from tests.node.test_cli import assert_one_line_error
from tests.served import served_in_a_thread

ETH = 10**18
STAGES = 2
#: Serves whatever state it likes: a node that tampers with what it sends.
Source = Callable[[int, bool], Awaitable[StageSnapshot | None]]


@dataclass(frozen=True)
class RunNodes:
    """A run on the devnet and its node keys: the data node, a relay of each stage, a second
    replica of stage 2, and a registered node that is not in the run."""

    run_id: int
    model: str
    data: bytes
    relay1: bytes
    relay2: bytes
    replica2: bytes
    stranger: bytes


def open_run_with_nodes(
    contracts: Contracts, sponsor: Sender, wallet: Sender, model: str
) -> RunNodes:
    config = RunConfig(
        model_config_hash(RunModel.of(TrainingSettings(model=model, stages=STAGES))),
        DATASET_HASH,
        STAGES,
        600,
        10,
        ETH,
        600,
        2 * ETH,
        10**14,
    )
    run_id = open_run(contracts, sponsor, config, 5 * ETH)
    keys = [bytes(Account.create().key) for _ in range(5)]
    data, relay1, relay2, replica2, stranger = keys
    for key in keys:
        # A data node is the sponsor's own.
        owner = sponsor if key == data else wallet
        register_node(contracts, owner, key, Capacity("cpu", 1024, 10, 2), 2 * ETH)
    add_data_node(contracts, sponsor, run_id, Account.from_key(data).address)
    for relay in (relay1, relay2, replica2):
        join_run(contracts, wallet, run_id, Account.from_key(relay).address)
    return RunNodes(run_id, model, data, relay1, relay2, replica2, stranger)


@pytest.fixture(scope="module")
def chain(devnet: RunningDevnet) -> Contracts:
    info = devnet.info
    return Contracts.at(connect(info.rpc_url), info.contracts, gas_limit=TEST_GAS_LIMIT)


@pytest.fixture(scope="module")
def runs(devnet: RunningDevnet, chain: Contracts) -> dict[str, RunNodes]:
    accounts = devnet.info.accounts
    sponsor = Sender.from_account(Account.from_key(accounts[0].private_key))
    wallet = Sender.from_account(Account.from_key(accounts[1].private_key))
    return {
        model: open_run_with_nodes(chain, sponsor, wallet, model)
        for model in ("gpt-tiny", "llama-tiny")
    }


def trained_pipeline(model: str) -> LocalPipeline:
    """The parts of ``model`` in 2 stages after one optimizer step on two microbatches."""
    family, _, size = model.partition("-")
    plan = plan_partition(named_config(family, size), STAGES)
    sampler = MicrobatchSampler(load_default_corpus(), batch_size=2, seq_len=16)
    pipeline = LocalPipeline(plan, TrainingSettings(device="cpu"), 3, sampler, through_codec=False)
    for microbatch in range(2):
        pipeline.run_microbatch(microbatch, lambda m, s: 0)
    pipeline.finish_iteration()
    return pipeline


@dataclass(frozen=True)
class Served:
    """A node's key and what it serves: its part (``worker`` at ``stage``) or ``source``."""

    key: bytes
    stage: int
    worker: PartTrainer | None = None
    source: Source | None = None


@contextmanager
def serving(port: ChainPort, run_id: int, nodes: list[Served]) -> Iterator[list[str]]:
    """Each node's own libp2p host serving its state, admitting only the run's nodes as the
    chain has them; yields their addresses."""

    @asynccontextmanager
    async def hosts() -> AsyncIterator[list[str]]:
        async with AsyncExitStack() as stack:
            found = []
            for node in nodes:
                host = await stack.enter_async_context(running_host(identity_from_key(node.key)))
                rpc = RequestResponse(host, admit=RunAdmission(port, run_id))
                if node.worker is not None:
                    limiter = trio.CapacityLimiter(1)
                    serve_stage_state(rpc, node.worker, node.stage, 5.0, limiter)  # type: ignore[arg-type]
                else:
                    assert node.source is not None
                    serve_weights(rpc, node.source, 5.0)
                found.append(full_address(host))
            yield found

    with served_in_a_thread(hosts) as addresses:
        yield addresses


def honest(run: RunNodes, pipeline: LocalPipeline) -> list[Served]:
    return [
        Served(run.data, 0, pipeline.data_node),
        Served(run.relay1, 1, pipeline.stages[0][0]),
        Served(run.relay2, 2, pipeline.stages[1][0]),
    ]


def export(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, run: RunNodes, out: Path,
    *peers: str, json_out: bool = True, model: str | None = None, data: str = "",
) -> tuple[int, Any, str]:  # fmt: skip
    argv = ["--devnet-file", str(devnet_file), "export", "--run", str(run.run_id)]
    argv += ["--out", str(out), "--model", model or run.model, "--timeout-s", "5"]
    argv += ["--data", data]
    argv += [flag for peer in peers for flag in ("--peer", peer)]
    code = main([*argv, "--json"] if json_out else argv)
    printed, err = capsys.readouterr()
    return code, json.loads(printed) if code == 0 and json_out else printed, err


def unreachable_address() -> str:
    """A well-formed address of a node key, on a port nothing listens on."""
    return f"/ip4/127.0.0.1/tcp/9/p2p/{peer_id_of(identity_from_key(bytes(Account.create().key)))}"


def address_of(key: bytes) -> str:
    return str(Account.from_key(key).address)


def test_the_export_loads_in_transformers_with_the_stage_chains_logits(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, runs: dict[str, RunNodes],
    chain: Contracts, tmp_path: Path,
) -> None:  # fmt: skip
    run = runs["llama-tiny"]
    pipeline = trained_pipeline(run.model)
    stranger = Served(run.stranger, 1, trained_pipeline(run.model).stages[0][0])
    with serving(chain.port(), run.run_id, [*honest(run, pipeline), stranger]) as at:
        code, result, err = export(
            capsys, devnet_file, run, tmp_path / "model", *at, unreachable_address()
        )
        assert code == 0, err
        code, printed, err = export(
            capsys, devnet_file, run, tmp_path / "again", *at[:3], json_out=False
        )
    assert code == 0, err
    assert "LlamaForCausalLM" in printed and "written to" in printed
    assert result["step"] == 1 and result["architecture"] == "LlamaForCausalLM"
    froms = [(p["stage"], p["layers"], p["node"]) for p in result["parts"]]
    assert froms == [
        (0, None, address_of(run.data)),
        (1, [0, 1], address_of(run.relay1)),
        (2, [2, 3], address_of(run.relay2)),
    ]
    peers = result["peers"]
    assert peers[address_of(run.stranger)].startswith("not a node of run")
    assert sum(why.startswith("unreachable") for why in peers.values()) == 1
    out = tmp_path / "model"
    assert sorted(result["files"]) == [
        "README.md", "config.json", "gwtf-export.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip
    provenance = json.loads((out / "gwtf-export.json").read_text())
    assert provenance == {k: v for k, v in result.items() if k not in ("out", "files")}

    theirs: Any = transformers.AutoModelForCausalLM.from_pretrained(out)
    theirs.eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    data, stage1, stage2 = pipeline.data_node, pipeline.stages[0][0], pipeline.stages[1][0]
    tokens = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        through_stages = data.part.logits(stage2.module(stage1.module(data.part.embed(tokens))))
        got = theirs(tokens).logits
    assert float((got - through_stages).abs().max()) < 1e-4


def test_stages_at_different_steps_are_refused(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, runs: dict[str, RunNodes],
    chain: Contracts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # These nodes never step: every round of manifests is the same, whatever the pause between
    # two (3 s each, for a snapshot to age out of a live node's cache).
    monkeypatch.setattr(gather, "ROUND_PAUSE_S", 0.05)
    run = runs["gpt-tiny"]
    pipeline = trained_pipeline(run.model)
    pipeline.stages[1][0].step_count += 1  # stage 2 one step ahead of the others
    with serving(chain.port(), run.run_id, honest(run, pipeline)) as at:
        code, _, err = export(capsys, devnet_file, run, tmp_path / "model", *at)
    assert code == 6
    assert_one_line_error(err, "no common optimizer step (the data part at [1]; stage 1 at [1]")
    assert not (tmp_path / "model").exists()


def test_a_missing_stage_is_refused(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, runs: dict[str, RunNodes],
    chain: Contracts, tmp_path: Path,
) -> None:  # fmt: skip
    run = runs["gpt-tiny"]
    with serving(chain.port(), run.run_id, honest(run, trained_pipeline(run.model))) as at:
        code, _, err = export(capsys, devnet_file, run, tmp_path / "model", at[0], at[1])
    assert code == 6
    assert_one_line_error(err, "no node given offers stage 2; give a node of each stage")


def weights_snapshot(worker: PartTrainer, stage: int) -> StageSnapshot:
    """What an honest node serves an exporter of ``worker``'s part."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.safetensors"
        save_part_state(worker, path, weights_only=True)  # type: ignore[arg-type]
        return StageSnapshot(stage, worker.step_count, path.read_bytes(), weights_only=True)


@dataclass(frozen=True)
class Tampered(StageSnapshot):
    """A state whose manifest names an honest replica's digest but whose bytes are others."""

    promised: bytes = b""

    @property
    def digest(self) -> bytes:
        return self.promised


def test_a_state_failing_its_digest_is_refused_and_another_replica_taken(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, runs: dict[str, RunNodes],
    chain: Contracts, tmp_path: Path,
) -> None:  # fmt: skip
    run = runs["gpt-tiny"]
    pipeline = trained_pipeline(run.model)
    honest_parts = honest(run, pipeline)
    promised = weights_snapshot(pipeline.stages[1][0], 2)

    async def tampered(stage: int, weights_only: bool) -> StageSnapshot | None:
        if stage != 2:
            return None
        return Tampered(stage, promised.step, b"\x00" * 4096, weights_only, promised.digest)

    cheat = Served(run.relay2, 2, source=tampered)
    replica = Served(run.replica2, 2, pipeline.stages[1][0])
    nodes = [*honest_parts[:2], cheat, replica]
    with serving(chain.port(), run.run_id, nodes) as at:
        code, _, err = export(capsys, devnet_file, run, tmp_path / "model", *at[:3])
        assert code == 5
        assert_one_line_error(err, "no node served stage 2 intact")
        assert "fails its manifest's digest" in err
        code, result, err = export(capsys, devnet_file, run, tmp_path / "model", *at)
    assert code == 0, err
    assert result["parts"][2]["node"] == address_of(run.replica2)
    assert result["peers"][address_of(run.relay2)].startswith("stage 2 not taken: ")


def test_replicas_that_disagree_on_a_parts_weights_stop_the_export(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, runs: dict[str, RunNodes],
    chain: Contracts, tmp_path: Path,
) -> None:  # fmt: skip
    run = runs["gpt-tiny"]
    pipeline = trained_pipeline(run.model)
    forged = trained_pipeline(run.model).stages[1][0]
    with torch.no_grad():  # other weights, at the same step: intact bytes, a valid file
        next(forged.module.parameters()).add_(1e-3)
    nodes = [*honest(run, pipeline)[:2], Served(run.relay2, 2, forged),
             Served(run.replica2, 2, pipeline.stages[1][0])]  # fmt: skip
    with serving(chain.port(), run.run_id, nodes) as at:
        code, _, err = export(capsys, devnet_file, run, tmp_path / "model", *at)
    assert code == 6
    assert_one_line_error(err, "disagree on its weights")
    assert address_of(run.relay2) in err and address_of(run.replica2) in err
    assert not (tmp_path / "model" / "model.safetensors").exists()


def test_a_non_empty_out_dir_another_model_and_unreachable_peers_are_refused(
    capsys: pytest.CaptureFixture[str], devnet_file: Path, runs: dict[str, RunNodes],
    tmp_path: Path,
) -> None:  # fmt: skip
    run = runs["gpt-tiny"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("a sponsor's file")
    code, _, err = export(capsys, devnet_file, run, full, unreachable_address())
    assert code == 2
    assert_one_line_error(err, "exists and is not empty")
    assert (full / "notes.txt").read_text() == "a sponsor's file"
    code, _, err = export(capsys, devnet_file, run, tmp_path / "m", unreachable_address(),
                          model="llama-tiny")  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "trains another model than llama-tiny, 2 stages")
    # A data set of the same vocabulary (bytes) is still not the run's.
    (tmp_path / "corpus.txt").write_text("Some words.\n\nOther words.\n")
    data = prepare(PrepareOptions((tmp_path / "corpus.txt",), tmp_path / "set", val_fraction=0))
    code, _, err = export(capsys, devnet_file, run, tmp_path / "m", unreachable_address(),
                          data=str(tmp_path / "set"))  # fmt: skip
    assert code == 2
    assert_one_line_error(err, "trains on the shipped corpus, not on training.data")
    assert data.manifest.digest in err
    code, _, err = export(capsys, devnet_file, run, tmp_path / "m", unreachable_address())
    assert code == 5
    assert_one_line_error(err, "none of the 1 peers given answered")
    assert not (tmp_path / "m").exists()
