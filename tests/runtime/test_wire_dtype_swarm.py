"""A live swarm on a bf16 wire: every activation and gradient crosses the network as bf16, each
part computes in float32, and the losses follow the same model trained with the same rounding in
one process (``LocalPipeline``, the codec's round trip in place of the network)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import trio

from gwtf.node.training.data import MicrobatchSampler, load_default_corpus
from gwtf.node.training.local_pipeline import LocalPipeline, round_robin
from gwtf.node.training.partition import plan_partition
from tests.runtime import swarm_harness as harness
from tests.runtime.swarm_harness import Swarm, reference_losses, run_swarm

ITERATIONS, BATCH = 2, 4
BF16 = replace(harness.TRAINING, wire_dtype="bfloat16")


def local_bf16_losses() -> list[float]:
    """The mean loss per iteration of the same microbatch ids trained in one process."""
    sampler = MicrobatchSampler(
        load_default_corpus(), batch_size=harness.BATCH_SIZE, seq_len=harness.SEQ_LEN
    )
    pipeline = LocalPipeline(
        plan_partition(harness.MODEL, harness.STAGES), BF16, harness.SEED, sampler
    )
    means = []
    for step in range(ITERATIONS):
        ids = range(step * BATCH, (step + 1) * BATCH)
        losses = [pipeline.run_microbatch(m, lambda m, s: round_robin(m, s, 1)) for m in ids]
        pipeline.finish_iteration()
        means.append(sum(losses) / len(losses))
    return means


@pytest.mark.slow  # ~40 s: the wire dtype itself is covered by tests/training/test_wire_dtype.py
def test_a_swarm_on_a_bf16_wire_trains_as_bf16_rounding_does_in_one_process(
    tmp_path: Path,
) -> None:
    swarm = Swarm()
    sent: list[torch.dtype] = []

    async def main() -> list:  # type: ignore[type-arg]
        async def watch(swarm: Swarm) -> None:
            while "a1" not in swarm.nodes:
                await trio.sleep(0.01)
            worker = swarm.nodes["a1"].role.worker  # type: ignore[union-attr]
            forward = worker.forward

            def recording(microbatch_id: int, activation: torch.Tensor) -> torch.Tensor:
                output = forward(microbatch_id, activation)
                sent.extend([activation.dtype, output.dtype])
                return output

            worker.forward = recording

        with trio.fail_after(120):
            return await run_swarm(
                tmp_path, ITERATIONS, BATCH, {"a1": 1, "b1": 2}, watch, swarm,
                relay_settings={"training": BF16}, data_settings={"training": BF16},
            )  # fmt: skip

    results = trio.run(main)
    assert sent and set(sent) == {torch.bfloat16}
    losses = [r.loss for r in results]
    assert losses == pytest.approx(local_bf16_losses(), abs=1e-5)
    assert losses != reference_losses(ITERATIONS, BATCH)  # bf16 rounding shows
    assert losses == pytest.approx(reference_losses(ITERATIONS, BATCH), abs=1e-2)
