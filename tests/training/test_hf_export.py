"""The Hugging Face export: ``transformers`` loads what ``to_hf`` maps, as ``GPT2LMHeadModel`` or
``LlamaForCausalLM``, with nothing missing or left over, and its logits on random tokens are our
whole model's within 1e-4; tensors or configs that do not fit are refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from gwtf.node.export.writer import write_checkpoint
from gwtf.node.training.config import GPTConfig, LlamaConfig, ModelConfig, named_config
from gwtf.node.training.errors import ExportError
from gwtf.node.training.hf_export import to_hf
from gwtf.node.training.model import WholeModel

CONFIGS = {
    "gpt-tiny": named_config("gpt", "tiny"),
    "gpt-no-bias-untied": GPTConfig(
        n_layer=2, n_head=2, d_model=32, block_size=16, bias=False, tie_embeddings=False
    ),
    "llama-tiny": named_config("llama", "tiny"),
    "llama-one-kv-head-tied": LlamaConfig(
        n_layer=2, n_head=4, n_kv_head=1, d_model=32, d_ff=48, block_size=16,
        rope_theta=500.0, norm_eps=1e-6, tie_embeddings=True,
    ),
}  # fmt: skip
ARCHITECTURES = {"gpt": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


def trained_looking(config: ModelConfig, seed: int = 1) -> WholeModel:
    """A whole model whose every weight is moved off its initial value (norm gains off 1,
    biases off 0), so a swapped or misplaced tensor shows in the logits."""
    model = WholeModel(config, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return model.eval()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_transformers_loads_the_export_and_its_logits_match(name: str, tmp_path: Path) -> None:
    config = CONFIGS[name]
    ours = trained_looking(config)
    write_checkpoint(to_hf(config, ours.state_dict()), tmp_path / "out", {"run": 1})
    loaded: Any = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", output_loading_info=True
    )
    theirs, loading = loaded
    assert type(theirs).__name__ == ARCHITECTURES[config.family]
    assert not any(loading.values()), loading  # nothing missing, unexpected or mismatched
    tokens = torch.randint(0, config.vocab_size, (2, config.block_size))
    with torch.no_grad():
        expected = ours.logits(tokens)
        got = theirs.eval()(tokens).logits
    assert got.shape == expected.shape
    assert float((got - expected).abs().max()) < 1e-4


def test_a_missing_extra_or_misshapen_tensor_is_refused() -> None:
    config = CONFIGS["llama-tiny"]
    tensors = WholeModel(config, 0).state_dict()
    missing = {k: v for k, v in tensors.items() if k != "body.blocks.3.mlp.gate_up.weight"}
    with pytest.raises(ExportError, match=r"lack body\.blocks\.3\.mlp\.gate_up\.weight"):
        to_hf(config, missing)
    with pytest.raises(ExportError, match="1 tensors have no place"):
        to_hf(config, {**tensors, "body.blocks.4.norm1.weight": torch.ones(config.d_model)})
    misshapen = {**tensors, "data.final_norm.weight": torch.ones(config.d_model + 1)}
    with pytest.raises(ExportError, match=r"data\.final_norm\.weight has shape"):
        to_hf(config, misshapen)
    mixed = {**tensors, "data.final_norm.weight": torch.ones(config.d_model, dtype=torch.float64)}
    with pytest.raises(ExportError, match="one float dtype"):
        to_hf(config, mixed)


def test_a_tied_head_that_is_not_the_embedding_is_refused() -> None:
    config = CONFIGS["gpt-tiny"]
    tensors = dict(WholeModel(config, 0).state_dict())
    tensors["data.head.weight"] = tensors["data.head.weight"] + 1.0
    with pytest.raises(ExportError, match="ties its head"):
        to_hf(config, tensors)


@dataclasses.dataclass(frozen=True)
class LlamaWithQkNorm(LlamaConfig):
    """A feature the exporter has not learned: it must refuse, not drop it."""

    qk_norm: bool = True


def test_a_config_feature_the_layout_cannot_hold_is_refused() -> None:
    base = CONFIGS["llama-tiny"]
    config = LlamaWithQkNorm(**dataclasses.asdict(base))
    with pytest.raises(ExportError, match="qk_norm of the llama family have no counterpart"):
        to_hf(config, WholeModel(base, 0).state_dict())
