"""The proof that pipelining changes nothing: a model trained whole and the same model split into
S stages with R replicas per stage (microbatches spread over replicas, gradients averaged by
count) agree in every loss and every parameter, for both families, and still agree when a replica
crashes mid-iteration and its microbatches are redone elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gwtf.node.training.checkpoint import load_part_state, save_part_state, state_digest
from gwtf.node.training.config import named_config
from gwtf.node.training.data import MicrobatchSampler
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.local_pipeline import LocalPipeline, round_robin
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker
from gwtf.node.training.trainer import WholeModelTrainer
from tests.training.helpers import max_param_difference

SEED = 1234
STEPS = 3
MICROBATCHES_PER_STEP = 4
LOSS_TOLERANCE = 1e-12
PARAM_TOLERANCE = 1e-11


def iteration_ids(step: int) -> list[int]:
    return list(range(step * MICROBATCHES_PER_STEP, (step + 1) * MICROBATCHES_PER_STEP))


def train_whole(
    whole: WholeModelTrainer, sampler: MicrobatchSampler, steps: range
) -> list[list[float]]:
    losses = []
    for step in steps:
        losses.append([whole.train_microbatch(*sampler(m)) for m in iteration_ids(step)])
        whole.step()
    return losses


@pytest.mark.parametrize("family", ["gpt", "llama"])
@pytest.mark.parametrize("n_stages", [2, 3])
@pytest.mark.parametrize("n_replicas", [1, 2])
def test_split_training_matches_whole_training(
    family: str,
    n_stages: int,
    n_replicas: int,
    exact_settings: TrainingSettings,
    sampler: MicrobatchSampler,
) -> None:
    plan = plan_partition(named_config(family, "tiny"), n_stages)
    whole = WholeModelTrainer(plan, exact_settings, SEED)
    pipeline = LocalPipeline(plan, exact_settings, SEED, sampler, n_replicas)
    whole_losses = train_whole(whole, sampler, range(STEPS))

    clipped = False
    for step in range(STEPS):
        route = lambda m, s: round_robin(m, s, n_replicas)  # noqa: E731
        split_losses = [pipeline.run_microbatch(m, route) for m in iteration_ids(step)]
        assert split_losses == pytest.approx(whole_losses[step], abs=LOSS_TOLERANCE, rel=0)
        reports = pipeline.finish_iteration()
        clipped |= any(norm > 0.5 for report in reports for norm in report.grad_norms)

    parts: list[StageWorker | DataNodeWorker] = [
        pipeline.data_node,
        *(replicas[0] for replicas in pipeline.stages),
    ]
    assert max_param_difference(whole, parts) < PARAM_TOLERANCE
    for replicas in pipeline.stages:
        assert len({state_digest(replica) for replica in replicas}) == 1
    assert clipped, "the tight clip norm must have been exercised for the proof to cover it"
    # Training moved the weights: agreement is not the trivial agreement of untouched models.
    untrained = WholeModelTrainer(plan, exact_settings, SEED)
    assert max_param_difference(untrained, parts) > 1e-4


def run_recorded(
    pipeline: LocalPipeline, microbatch_id: int, path: list[StageWorker]
) -> tuple[float, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """One microbatch along ``path``, keeping each stage's input, output gradient and the
    gradient it sent upstream (what the neighbouring relays buffer until acknowledged)."""
    inputs: list[torch.Tensor] = []
    output_grads: list[torch.Tensor] = []
    input_grads: list[torch.Tensor] = []
    activation = pipeline.data_node.embed(microbatch_id)
    for worker in path:
        inputs.append(activation)
        activation = worker.forward(microbatch_id, activation)
    loss, grad = pipeline.data_node.loss_and_backward(microbatch_id, activation)
    for worker in reversed(path):
        output_grads.insert(0, grad)
        grad = worker.backward(microbatch_id, grad)
        input_grads.insert(0, grad)
    pipeline.data_node.backward_embedding(microbatch_id, grad)
    return loss, inputs, output_grads, input_grads


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_replica_crash_mid_iteration_and_a_join_still_match_whole_training(
    family: str, exact_settings: TrainingSettings, sampler: MicrobatchSampler, tmp_path: Path
) -> None:
    plan = plan_partition(named_config(family, "tiny"), 3)
    whole = WholeModelTrainer(plan, exact_settings, SEED)
    pipeline = LocalPipeline(plan, exact_settings, SEED, sampler, n_replicas=2)
    whole_losses = train_whole(whole, sampler, range(STEPS))
    route = lambda m, s: round_robin(m, s, 2)  # noqa: E731

    first_ids = iteration_ids(0)
    assert [pipeline.run_microbatch(m, route) for m in first_ids] == pytest.approx(
        whole_losses[0], abs=LOSS_TOLERANCE, rel=0
    )
    pipeline.finish_iteration()

    # Iteration 2: stage 1's replica r1 finishes microbatch `done`, holds `pending` after its
    # forward, then crashes; its accumulated gradient and saved state die with it.
    (s0_a, s0_b), (survivor, doomed), (s2_a, s2_b) = pipeline.stages
    done, pending, plain_a, plain_b = iteration_ids(1)
    losses: dict[int, float] = {}
    losses[plain_a] = pipeline.run_microbatch(plain_a, lambda m, s: 0)
    losses[done], done_inputs, done_out_grads, done_in_grads = run_recorded(
        pipeline, done, [s0_a, doomed, s2_a]
    )
    first_hop = s0_b.forward(pending, pipeline.data_node.embed(pending))
    doomed.forward(pending, first_hop)
    assert doomed.in_flight == (pending,)
    del doomed

    # Recovery: stage 0 re-sends its buffered output of `pending` to the survivor; the survivor
    # redoes `done` from the buffered input and output gradient (its upstream gradient is the
    # one stage 0 already received, so it is not sent again).
    activation = s2_b.forward(pending, survivor.forward(pending, first_hop))
    losses[pending], grad = pipeline.data_node.loss_and_backward(pending, activation)
    grad = s0_b.backward(pending, survivor.backward(pending, s2_b.backward(pending, grad)))
    pipeline.data_node.backward_embedding(pending, grad)
    survivor.forward(done, done_inputs[1])
    assert torch.equal(survivor.backward(done, done_out_grads[1]), done_in_grads[1])
    losses[plain_b] = pipeline.run_microbatch(plain_b, lambda m, s: 1 if s != 1 else 0)
    assert [losses[m] for m in iteration_ids(1)] == pytest.approx(
        whole_losses[1], abs=LOSS_TOLERANCE, rel=0
    )
    pipeline.finish_iteration(live=[[s0_a, s0_b], [survivor], [s2_a, s2_b]])

    # A new replica joins stage 1 by loading the survivor's state, then iteration 3 runs on both.
    joiner = StageWorker(plan, 1, exact_settings, seed=999, replica_id="r9")
    save_part_state(survivor, tmp_path / "stage1.safetensors")
    load_part_state(joiner, tmp_path / "stage1.safetensors")
    pipeline.stages[1] = [survivor, joiner]
    third = [pipeline.run_microbatch(m, route) for m in iteration_ids(2)]
    assert third == pytest.approx(whole_losses[2], abs=LOSS_TOLERANCE, rel=0)
    pipeline.finish_iteration()

    assert state_digest(survivor) == state_digest(joiner)
    parts: list[StageWorker | DataNodeWorker] = [pipeline.data_node, s0_a, survivor, s2_a]
    assert max_param_difference(whole, parts) < PARAM_TOLERANCE
