"""The 125m presets train in a live swarm on CPU exactly like the whole model trained alone.

A data node and one relay per stage, real libp2p hosts on 127.0.0.1 in one process, train the
GPT-2 124M layout (12 blocks of 768, 12 heads, GPT-2's vocabulary of 50,257: 124M parameters)
and the Llama-style 125m (12 blocks of 768, grouped-query attention, SwiGLU, a 32,000
vocabulary) for a few iterations on short microbatches, and their losses match whole-model
training on the same microbatch ids within the tolerance of the small swarms' tests. Slow: each
takes one to two minutes of a loaded two-core machine (``pytest -m slow``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from gwtf.node.training.config import total_param_count
from gwtf.node.training.partition import model_for_run
from gwtf.node.training.reference import whole_model_losses
from tests.runtime.swarm_harness import FLOW, SEED, TRAINING, Swarm, run_swarm

ITERATIONS = 3
BATCH = 2  # microbatches per iteration
BATCH_SIZE, SEQ_LEN = 2, 32
#: GPT-2's BPE vocabulary and Llama's SentencePiece one (training.vocab_size: no data set).
VOCABULARIES = {"gpt-125m": 50257, "llama-125m": 32000}
#: A hop of six 768-wide blocks takes ~1 s of a busy core: deadlines for the load, not speed.
SLOW_FLOW = replace(FLOW, ack_deadline_s=60.0, keepalive_timeout_s=10.0, keepalive_interval_s=2.0)


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(VOCABULARIES))
def test_a_125m_model_trains_in_a_live_swarm_like_the_whole_model(
    tmp_path: Path, model: str
) -> None:
    training = replace(
        TRAINING,
        model=model,
        stages=2,
        batch_size=BATCH_SIZE,
        seq_len=SEQ_LEN,
        seed=SEED,
        microbatches_per_iteration=BATCH,
        vocab_size=VOCABULARIES[model],
        stall_timeout_s=300.0,
    )
    config = model_for_run(model, SEQ_LEN, 2, VOCABULARIES[model])
    if model == "gpt-125m":
        assert round(total_param_count(config) / 1e6) == 124  # GPT-2 small's count
    settings = {
        "model": config,
        "training": training,
        "flow": SLOW_FLOW,
        "stall_timeout_s": 300.0,
        "batch_size": BATCH_SIZE,
        "seq_len": SEQ_LEN,
    }
    swarm = Swarm()

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(900):
            return await run_swarm(
                tmp_path,
                ITERATIONS,
                BATCH,
                {"a": 1, "b": 2},
                swarm=swarm,
                relay_settings=settings,
                data_settings=settings,
            )

    results = trio.run(main)
    reference = whole_model_losses(training, ITERATIONS)
    assert [r.iteration for r in results] == list(range(ITERATIONS))
    assert [r.loss for r in results] == pytest.approx(reference, rel=1e-4)
    # The whole vocabulary is in play: the untrained model's loss is about ln(vocabulary).
    assert reference[0] == pytest.approx(math.log(VOCABULARIES[model]), abs=0.3)
    # Each relay held half the blocks, as its status says.
    for name in ("a", "b"):
        memory = swarm.nodes[name].memory
        assert memory is not None and memory.memory.weights > 6 * 6_000_000 * 4
