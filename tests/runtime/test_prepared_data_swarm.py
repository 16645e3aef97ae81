"""A live swarm trains on a prepared data set, with its tokenizer's vocabulary, exactly like the
whole model trained alone on the same (data set hash, microbatch id) windows, and its data node
measures the swarm's validation loss as the whole model's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from node.training.partition import model_for_run
from node.training.prepare import PrepareOptions, prepare
from node.training.reference import whole_model_run
from tests.runtime.swarm_harness import (
    BATCH_SIZE,
    MODEL_NAME,
    SEED,
    SEQ_LEN,
    STAGES,
    TRAINING,
    run_swarm,
)

ITERATIONS = 3
BATCH = 4


def test_a_swarm_trains_on_a_prepared_data_set_like_the_whole_model(tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"text": f"record {i}: " + "lorem ipsum dolor " * (i % 9 + 2)}) + "\n"
            for i in range(400)
        )
    )
    manifest = prepare(
        PrepareOptions((corpus,), tmp_path / "set", train_vocab=290, val_fraction=0.05)
    ).manifest
    training = replace(
        TRAINING, data=str(tmp_path / "set"), validation_every=2, validation_windows=6
    )
    model = model_for_run(MODEL_NAME, SEQ_LEN, STAGES, manifest.vocab_size)
    assert model.vocab_size == 290

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(
                tmp_path,
                ITERATIONS,
                BATCH,
                {"a1": 1, "b1": 2},
                relay_settings={"model": model},
                data_settings={"model": model, "training": training},
            )

    results = trio.run(main)
    reference = whole_model_run(
        replace(
            training,
            model=MODEL_NAME,
            stages=STAGES,
            batch_size=BATCH_SIZE,
            seq_len=SEQ_LEN,
            seed=SEED,
            microbatches_per_iteration=BATCH,
        ),
        ITERATIONS,
    )
    assert [r.loss for r in results] == pytest.approx(reference.losses, rel=1e-4)
    assert reference.losses[0] == pytest.approx(5.67, abs=0.3)  # ln(290): the new vocabulary's
    # The data node's validation loss of the swarm's model (after iteration 1's step, from the
    # relays' weights) is the whole model's on the same fixed windows.
    validated = [(r.iteration, r.validation_loss) for r in results if r.validation_loss]
    assert [i for i, _ in validated] == [i for i, _ in reference.validation] == [1]
    assert validated[0][1] == pytest.approx(reference.validation[0][1], rel=1e-4)
    assert results[0].validation_loss is None
