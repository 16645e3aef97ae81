"""The parts an export gathers make one model or are refused: real workers' weights-only state
files, read back as a peer's bytes, assemble into the whole model's tensors; parts of different
steps, a layer held twice or by no part, a second data part and another model's part are each
an ``ExportError``, and a tampered or malformed file a ``CheckpointError``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gwtf.node.export.assembly import whole_tensors
from gwtf.node.training.checkpoint import PartState, read_part_state, save_part_state
from gwtf.node.training.config import named_config
from gwtf.node.training.data import MicrobatchSampler, load_default_corpus
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.errors import CheckpointError, ExportError
from gwtf.node.training.model import WholeModel
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker
from gwtf.node.training.trainer import PartTrainer

CONFIG = named_config("gpt", "tiny")
PLAN = plan_partition(CONFIG, 2)
SEED = 4
SETTINGS = TrainingSettings(device="cpu")


def state_bytes(worker: PartTrainer, tmp_path: Path) -> bytes:
    path = tmp_path / "state.safetensors"
    save_part_state(worker, path, weights_only=True)
    return path.read_bytes()


@pytest.fixture(scope="module")
def blobs(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """The data part's and each stage's weights-only state file, as a node serves them."""
    tmp = tmp_path_factory.mktemp("states")
    sampler = MicrobatchSampler(load_default_corpus(), batch_size=2, seq_len=16)
    workers: list[PartTrainer] = [DataNodeWorker(PLAN, SETTINGS, SEED, sampler)]
    workers += [StageWorker(PLAN, s, SETTINGS, SEED) for s in range(PLAN.n_stages)]
    return [state_bytes(worker, tmp) for worker in workers]


def parts(blobs: list[bytes]) -> list[PartState]:
    return [read_part_state(blob) for blob in blobs]


def test_the_parts_assemble_into_the_whole_models_weights(blobs: list[bytes]) -> None:
    got = whole_tensors(CONFIG, parts(blobs))
    whole = WholeModel(CONFIG, SEED).state_dict()
    # The tied head is the embedding: a part's state names it once.
    expected = {name: t for name, t in whole.items() if name != "data.head.weight"}
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[name], expected[name]) for name in expected)


def test_parts_of_different_steps_are_refused(blobs: list[bytes]) -> None:
    data, first, second = parts(blobs)
    ahead = PartState(second.part, second.config, second.step + 1, second.digest, second.tensors)
    with pytest.raises(ExportError, match=r"different optimizer steps .*stage:2-4 at 1"):
        whole_tensors(CONFIG, [data, first, ahead])


def test_a_layer_held_twice_or_by_no_part_is_refused(blobs: list[bytes]) -> None:
    data, first, second = parts(blobs)
    with pytest.raises(ExportError, match="held by more than one part: 0 "):
        whole_tensors(CONFIG, [data, first, first, second])
    with pytest.raises(ExportError, match="layers 2, 3 are held by no part"):
        whole_tensors(CONFIG, [data, first])
    with pytest.raises(ExportError, match="2 data parts"):
        whole_tensors(CONFIG, [data, data, first, second])


def test_a_part_of_another_model_is_refused(blobs: list[bytes], tmp_path: Path) -> None:
    data, first, _ = parts(blobs)
    llama = plan_partition(named_config("llama", "tiny"), 2)
    other = read_part_state(state_bytes(StageWorker(llama, 1, SETTINGS, SEED), tmp_path))
    with pytest.raises(ExportError, match="is of another model"):
        whole_tensors(CONFIG, [data, first, other])


def test_a_tampered_or_malformed_state_file_is_refused(blobs: list[bytes]) -> None:
    tampered = bytearray(blobs[1])
    tampered[-1] ^= 0x01  # the last byte of the last tensor
    with pytest.raises(CheckpointError, match="not the digest its header names"):
        read_part_state(bytes(tampered))
    with pytest.raises(CheckpointError, match="not a state file"):
        read_part_state(b"\x10" + bytes(64))
