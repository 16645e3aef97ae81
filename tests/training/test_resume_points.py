"""A data node's resume points: written whole, the newest two kept, damaged or foreign ones
refused by name; and the attempt journal that keeps a resumed iteration's hop keys fresh."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from gwtf.node.runtime.dataplane.hop import origin_attempt
from gwtf.node.training.checkpoint import state_digest
from gwtf.node.training.config import named_config
from gwtf.node.training.data import MicrobatchSampler, load_default_corpus
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.errors import CheckpointError
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.resume_points import (
    ATTEMPT_RESERVE,
    AttemptJournal,
    kept_from,
    load_latest,
    point_name,
    points,
    snapshot,
    write_point,
)
from gwtf.node.training.settings import TrainingSettings
from tests.training.helpers import params_equal

PLAN = plan_partition(named_config("gpt", "tiny"), 2)
SETTINGS = TrainingSettings(device="cpu")
RUN = "run 1 seed 0 data tinyshakespeare microbatches 4x2x32"


@pytest.fixture(scope="module")
def sampler() -> MicrobatchSampler:
    return MicrobatchSampler(load_default_corpus(), 2, 32)


def trained(sampler: MicrobatchSampler, steps: int, seed: int = 0) -> DataNodeWorker:
    """A data part after ``steps`` steps (no relays: the head's gradient alone moves it)."""
    worker = DataNodeWorker(PLAN, SETTINGS, seed, sampler)
    for step in range(steps):
        activation = worker.embed(step)
        worker.loss_and_backward(step, activation.detach())
        worker.drop(step)
        worker.step()
    return worker


def test_a_resume_point_restores_weights_optimizer_and_step_and_names_the_position(
    tmp_path: Path, sampler: MicrobatchSampler
) -> None:
    worker = trained(sampler, 3)
    path = write_point(tmp_path, snapshot(worker, RUN, 3))
    assert path.name == point_name(3) and not list(tmp_path.glob("*.partial"))
    fresh = DataNodeWorker(PLAN, SETTINGS, 0, sampler)
    point = load_latest(tmp_path, fresh, RUN)
    assert point is not None and (point.next_iteration, point.step) == (3, 3)
    assert params_equal(fresh, worker) and state_digest(fresh) == state_digest(worker)
    assert fresh.optimizer.state  # AdamW's moments came back too


def test_a_snapshot_is_the_state_when_taken_not_when_written(
    tmp_path: Path, sampler: MicrobatchSampler
) -> None:
    worker = trained(sampler, 1)
    digest = state_digest(worker)
    taken = snapshot(worker, RUN, 1)
    with torch.no_grad():
        for param in worker.part.parameters():
            param.add_(1.0)  # the next iteration trains while the copy is written
    write_point(tmp_path, taken)
    fresh = DataNodeWorker(PLAN, SETTINGS, 0, sampler)
    load_latest(tmp_path, fresh, RUN)
    assert state_digest(fresh) == digest


def test_only_the_newest_two_are_kept_and_the_newest_is_loaded(
    tmp_path: Path, sampler: MicrobatchSampler
) -> None:
    worker = trained(sampler, 1)
    (tmp_path / (point_name(9) + ".partial")).write_bytes(b"a write a crash cut short")
    for position in (1, 2, 3, 4):
        write_point(tmp_path, snapshot(worker, RUN, position))
    assert [p.name for p in points(tmp_path)] == [point_name(4), point_name(3)]
    assert not list(tmp_path.glob("*.partial"))
    assert kept_from(tmp_path) == 3 and kept_from(tmp_path / "none") == 0
    point = load_latest(tmp_path, DataNodeWorker(PLAN, SETTINGS, 0, sampler), RUN)
    assert point is not None and point.next_iteration == 4


def test_no_resume_point_means_a_fresh_start(tmp_path: Path, sampler: MicrobatchSampler) -> None:
    assert load_latest(tmp_path / "absent", DataNodeWorker(PLAN, SETTINGS, 0, sampler), RUN) is None


def test_a_corrupt_resume_point_is_refused_by_name_and_changes_nothing(
    tmp_path: Path, sampler: MicrobatchSampler
) -> None:
    path = write_point(tmp_path, snapshot(trained(sampler, 2), RUN, 2))
    blob = bytearray(path.read_bytes())
    blob[-100] ^= 0xFF  # one flipped bit of a tensor
    path.write_bytes(bytes(blob))
    fresh = DataNodeWorker(PLAN, SETTINGS, 0, sampler)
    before = state_digest(fresh)
    with pytest.raises(CheckpointError, match="digest mismatch") as caught:
        load_latest(tmp_path, fresh, RUN)
    message = str(caught.value)
    assert str(path) in message and "delete it to resume from" in message and "\n" not in message
    assert state_digest(fresh) == before
    path.write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        load_latest(tmp_path, fresh, RUN)


def test_a_resume_point_of_another_run_or_part_is_refused_by_name(
    tmp_path: Path, sampler: MicrobatchSampler
) -> None:
    path = write_point(tmp_path, snapshot(trained(sampler, 1), RUN, 1))
    with pytest.raises(CheckpointError, match="is of 'run 1 seed 0") as caught:
        load_latest(tmp_path, DataNodeWorker(PLAN, SETTINGS, 0, sampler), "run 2 seed 0")
    assert str(path) in str(caught.value)
    bigger = plan_partition(named_config("gpt", "small"), 2)
    with pytest.raises(CheckpointError, match="holds config="):
        load_latest(tmp_path, DataNodeWorker(bigger, SETTINGS, 0, sampler), RUN)
    # A file renamed to another position is refused too: the name is what a resume trusts.
    path.rename(tmp_path / point_name(7))
    with pytest.raises(CheckpointError, match="names position '1'"):
        load_latest(tmp_path, DataNodeWorker(PLAN, SETTINGS, 0, sampler), RUN)


def test_a_process_resumed_into_an_iteration_numbers_its_attempts_above_the_earlier_ones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "attempts.json"
    first = AttemptJournal(path)
    assert first.begin(5) == 0
    used_first = {origin_attempt(first.block(5, tries)) for tries in range(3)}
    first.begin(6)  # it got into iteration 6 and stopped there
    # It needed more tries than it set aside: it sets aside more before using them.
    assert first.block(6, ATTEMPT_RESERVE) == ATTEMPT_RESERVE
    assert json.loads(path.read_text())["6"] == 2 * ATTEMPT_RESERVE
    # Resumed at iteration 5 (its newest resume point): every number is new there, and in 6.
    second = AttemptJournal(path)
    assert second.begin(5, forget_before=5) == ATTEMPT_RESERVE
    assert not used_first & {origin_attempt(second.block(5, t)) for t in range(3)}
    assert second.begin(6) == 2 * ATTEMPT_RESERVE
    # An iteration nobody started begins at the first block; those before a kept resume point
    # are forgotten.
    assert second.begin(7, forget_before=6) == 0
    assert sorted(json.loads(path.read_text())) == ["6", "7"]


def test_an_unreadable_attempt_journal_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "attempts.json"
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"attempt journal .*attempts\.json is unreadable"):
        AttemptJournal(path)
