"""A live swarm trains on a prepared data set, with its tokenizer's vocabulary, exactly like the
whole model trained alone on the same (data set hash, microbatch id) windows, and its data node
measures the swarm's validation loss as the whole model's (verified where two relays of each
stage serve the same weights, unverified where one does). The relays hold no data set: they
build the run's model from its vocabulary (``training.vocab_size``), and the model exports from
their parts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from gwtf.node.composition import model_of
from gwtf.node.export.assembly import whole_tensors
from gwtf.node.export.run import export_model
from gwtf.node.settings import load_settings
from gwtf.node.training.checkpoint import read_part_state, save_part_state
from gwtf.node.training.partition import model_for_run
from gwtf.node.training.prepare import PrepareOptions, prepare
from gwtf.node.training.reference import whole_model_run
from tests.runtime.swarm_harness import (
    BATCH_SIZE,
    MODEL_NAME,
    SEED,
    SEQ_LEN,
    STAGES,
    TRAINING,
    Swarm,
    run_swarm,
)

ITERATIONS = 3
BATCH = 4


@pytest.mark.parametrize(
    ("relays", "verified"),
    [({"a1": 1, "a2": 1, "b1": 2, "b2": 2}, True), ({"a1": 1, "b1": 2}, False)],
    ids=["two-relays-a-stage", "one-relay-a-stage"],
)
def test_a_swarm_trains_on_a_prepared_data_set_like_the_whole_model(
    tmp_path: Path, relays: dict[str, int], verified: bool
) -> None:
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
    # A relay's settings name no data set, only the run's vocabulary: its model is the run's.
    relay = load_settings(
        {
            "training.model": MODEL_NAME,
            "training.seq_len": SEQ_LEN,
            "training.stages": STAGES,
            "training.vocab_size": manifest.vocab_size,
        },
        env={},
    )
    assert not relay.training.data and model_of(relay) == model
    swarm = Swarm()

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(
                tmp_path,
                ITERATIONS,
                BATCH,
                relays,
                swarm=swarm,
                relay_settings={"model": model_of(relay)},
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
    # Two relays of each stage served the same weights: the figure is verified; with one,
    # it rests on that relay's word and says so.
    assert results[1].validation_verified is verified
    assert results[0].validation_loss is None
    # The run's model out of its parts, the relays' among them, with the data set's tokenizer.
    parts = []
    for name in ("data", "a1", "b1"):
        path = tmp_path / f"{name}.safetensors"
        save_part_state(swarm.nodes[name].role.worker, path, weights_only=True)
        parts.append(read_part_state(path.read_bytes()))
    summary = {"run": 1, "model": MODEL_NAME, "step": ITERATIONS, "parameters": 0, "parts": []}
    exported = export_model(
        model, whole_tensors(model, parts), tmp_path / "model", summary, manifest, 6
    )
    assert exported["dataset_hash"] == "0x" + manifest.digest
    assert exported["validation_loss"] is not None
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert config["vocab_size"] == 290
