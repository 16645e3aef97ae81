"""An export carries the run's tokenizer and a model card: ``transformers`` loads the folder with
``AutoTokenizer`` and ``AutoModelForCausalLM`` and generates text, for a data set's trained BPE
and for the byte tokenizer of the shipped corpus."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from gwtf.node.export.run import export_model
from gwtf.node.training.dataset import run_sampler
from gwtf.node.training.partition import model_for_run, plan_partition
from gwtf.node.training.prepare import PrepareOptions, prepare
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.shards import Manifest
from gwtf.node.training.trainer import WholeModelTrainer


def trained(family: str, manifest: Manifest | None) -> tuple[Any, dict[str, torch.Tensor]]:
    """A whole model trained two steps on the data set's microbatches, and its tensors."""
    vocab = manifest.vocab_size if manifest else None
    config = model_for_run(f"{family}-tiny", 16, 2, vocab)
    data = str(manifest.root) if manifest else ""
    training = TrainingSettings(model=f"{family}-tiny", seq_len=16, device="cpu", data=data)
    trainer = WholeModelTrainer(plan_partition(config, 2), training, seed=1)
    sampler = run_sampler(data, 2, 16, seed=1)
    for m in range(2):
        trainer.train_microbatch(*sampler(m))
        trainer.step()
    tensors = {
        name: t.detach().clone()
        for name, t in trainer.model.state_dict().items()
        if not (config.tie_embeddings and name == "data.head.weight")
    }
    return config, tensors


def summary(config: Any) -> dict[str, Any]:
    return {
        "run": 7,
        "model": f"{config.family}-tiny",
        "step": 2,
        "parameters": 1234,
        "parts": [],
        "peers": {},
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Manifest:
    folder = tmp_path_factory.mktemp("corpus")
    docs = [
        {"text": f"Chapter {i}. The river runs to the sea, and the sea is never full."}
        for i in range(300)
    ]
    (folder / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    options = PrepareOptions(
        (folder / "docs.jsonl",), folder / "set", train_vocab=300, val_fraction=0.1
    )
    return prepare(options).manifest


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_the_export_loads_with_its_tokenizer_and_generates(
    dataset: Manifest, family: str, tmp_path: Path
) -> None:
    config, tensors = trained(family, dataset)
    out = tmp_path / "model"
    result = export_model(config, tensors, out, summary(config), dataset, validation_windows=4)
    assert {"tokenizer.json", "tokenizer_config.json", "README.md"} <= set(result["files"])
    assert result["dataset_hash"] == "0x" + dataset.digest
    assert 3.0 < result["validation_loss"] < 7.0  # near ln(300) after two steps
    tokenizer: Any = transformers.AutoTokenizer.from_pretrained(out)
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(out)
    model.eval()
    assert isinstance(tokenizer, transformers.PreTrainedTokenizerFast)
    assert len(tokenizer) == config.vocab_size == 300
    prompt = tokenizer("The river runs", return_tensors="pt")
    assert tokenizer.decode(prompt["input_ids"][0]) == "The river runs"
    generated = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, prompt["input_ids"].shape[1] + 5)
    assert isinstance(tokenizer.decode(generated[0]), str)
    card = (out / "README.md").read_text()
    for fact in (
        "run 7",
        dataset.digest,
        "| optimizer steps | 2 |",
        f"{result['validation_loss']:.4f}",
    ):
        assert fact in card


def test_the_shipped_corpus_exports_the_byte_tokenizer(tmp_path: Path) -> None:
    config, tensors = trained("gpt", None)
    out = tmp_path / "model"
    result = export_model(config, tensors, out, summary(config), None)
    assert result["validation_loss"] is None and result["dataset_hash"] is None
    tokenizer: Any = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer("héllo")["input_ids"] == list("héllo".encode())
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(out)
    generated = model.generate(
        **tokenizer("To be", return_tensors="pt"), max_new_tokens=3, do_sample=False
    )
    assert generated.shape == (1, 8)
    assert "not measured" in (out / "README.md").read_text()


def test_the_model_card_counts_the_windows_it_evaluated(dataset: Manifest, tmp_path: Path) -> None:
    config, tensors = trained("gpt", dataset)
    result = export_model(config, tensors, tmp_path / "a", summary(config), dataset, 10**6)
    held = (dataset.val_tokens - 1) // config.block_size
    assert 0 < result["validation_windows"] == held < 10**6
    assert f"first {held} validation windows" in (tmp_path / "a" / "README.md").read_text()
    # A validation split shorter than the context is said to be so, not to be missing (a
    # Llama's weights do not depend on its context).
    config, tensors = trained("llama", dataset)
    short = replace(config, block_size=dataset.val_tokens)
    result = export_model(short, tensors, tmp_path / "b", summary(config), dataset)
    assert result["validation_loss"] is None and result["validation_windows"] == 0
    card = (tmp_path / "b" / "README.md").read_text()
    assert f"holds no window of {dataset.val_tokens + 1} tokens" in card
