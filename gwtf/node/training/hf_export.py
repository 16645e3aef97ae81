"""The model in the Hugging Face layout: the GPT-like family as GPT-2 (``GPT2LMHeadModel``), the
LLaMA-like family as Llama (``LlamaForCausalLM``). Pure: the whole model's tensors, named as
``WholeModel`` names them, in; the HF state dict and the content of ``config.json`` out.

Why each mapping computes what our modules compute:
* GPT-2's ``Conv1D`` keeps its weight as (in, out), the transpose of ``nn.Linear``'s; its fused
  ``c_attn`` is our ``qkv`` with the same q, k, v order and heads laid out head by head.
* ``GeluMLP`` uses exact (erf) GELU: GPT-2's ``"gelu"``, not ``"gelu_new"`` (the tanh one).
* GPT-2 always has biases and LayerNorm shifts: a model built without them exports zeros,
  which compute the same.
* ``Rotary`` rotates split halves (``rotate_half``, the angles repeated over both halves), the
  convention of HF's Llama, so q and k rows need no permutation; the fused ``qkv`` splits into
  q, k, v rows and ``gate_up`` into gate, then up (``SwiGLU`` chunks it in that order). Grouped
  key/value heads are shared by consecutive query heads in both (``repeat_interleave``).
* A tied head is the embedding: it is written once, as the embedding, and HF ties it on load.

A config field this module does not know refuses the export (``ExportError``): a feature added
to our models must be mapped here before a model with it is written in a layout that would
silently drop it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gwtf.node.training.config import GPTConfig, LlamaConfig, ModelConfig
from gwtf.node.training.errors import ExportError

GPT2_ARCHITECTURE = "GPT2LMHeadModel"
LLAMA_ARCHITECTURE = "LlamaForCausalLM"
#: ``nn.LayerNorm``'s default eps, which the GPT blocks and final norm of ``model.py`` use.
LAYER_NORM_EPS = 1e-5
#: The config fields each mapping below accounts for.
_KNOWN_FIELDS = {
    "gpt": {"n_layer", "n_head", "d_model", "block_size", "vocab_size", "bias",
            "tie_embeddings", "family"},
    "llama": {"n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "block_size", "vocab_size",
              "rope_theta", "norm_eps", "tie_embeddings", "family"},
}  # fmt: skip
_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
           torch.float16: "float16"}  # fmt: skip


@dataclass(frozen=True)
class HfCheckpoint:
    """What ``save_pretrained`` would write: the state dict and the config."""

    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any]


def to_hf(config: ModelConfig, tensors: Mapping[str, torch.Tensor]) -> HfCheckpoint:
    """The HF checkpoint of the model ``config`` with ``tensors`` (``WholeModel`` names; a tied
    ``data.head.weight`` may be left out). Refuses a tensor missing, extra or of a wrong shape."""
    _refuse_unknown_fields(config)
    dtype = _one_dtype(tensors)
    source = _Source(dict(tensors), config, dtype)
    if isinstance(config, GPTConfig):
        state = _gpt2_state(config, source)
        hf_config = gpt2_config(config)
    else:
        state = _llama_state(config, source)
        hf_config = llama_config(config)
    source.finish()
    return HfCheckpoint(state, {**hf_config, "torch_dtype": _DTYPES[dtype]})


def gpt2_config(config: GPTConfig) -> dict[str, Any]:
    return {
        "architectures": [GPT2_ARCHITECTURE],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": config.d_ff,
        "activation_function": "gelu",
        "layer_norm_epsilon": LAYER_NORM_EPS,
        # Our blocks have no dropout; HF's defaults (0.1) would make training from here differ.
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_embeddings,
        # The byte tokenizer has no special tokens (GPT-2's 50256 is outside its vocabulary).
        "bos_token_id": None,
        "eos_token_id": None,
        "use_cache": True,
    }


def llama_config(config: LlamaConfig) -> dict[str, Any]:
    return {
        "architectures": [LLAMA_ARCHITECTURE],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.d_model // config.n_head,
        "hidden_act": "silu",
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        # Both spellings: transformers 5 reads rope_parameters, 4.x rope_theta.
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "pretraining_tp": 1,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": None,
        "eos_token_id": None,
        "use_cache": True,
    }


def _gpt2_state(config: GPTConfig, source: _Source) -> dict[str, torch.Tensor]:
    d, ff = config.d_model, config.d_ff
    state = {
        "transformer.wte.weight": source.take("data.token_embedding.weight", config.vocab_size, d),
        "transformer.wpe.weight": source.take(
            "data.position_embedding.weight", config.block_size, d
        ),
        "transformer.ln_f.weight": source.take("data.final_norm.weight", d),
        "transformer.ln_f.bias": source.bias("data.final_norm.bias", d),
    }
    for i in range(config.n_layer):
        ours, theirs = f"body.blocks.{i}", f"transformer.h.{i}"
        state |= {
            f"{theirs}.ln_1.weight": source.take(f"{ours}.norm1.weight", d),
            f"{theirs}.ln_1.bias": source.bias(f"{ours}.norm1.bias", d),
            # Conv1D: (in, out), the transpose of nn.Linear's (out, in).
            f"{theirs}.attn.c_attn.weight": source.take(f"{ours}.attn.qkv.weight", 3 * d, d).t(),
            f"{theirs}.attn.c_attn.bias": source.bias(f"{ours}.attn.qkv.bias", 3 * d),
            f"{theirs}.attn.c_proj.weight": source.take(f"{ours}.attn.proj.weight", d, d).t(),
            f"{theirs}.attn.c_proj.bias": source.bias(f"{ours}.attn.proj.bias", d),
            f"{theirs}.ln_2.weight": source.take(f"{ours}.norm2.weight", d),
            f"{theirs}.ln_2.bias": source.bias(f"{ours}.norm2.bias", d),
            f"{theirs}.mlp.c_fc.weight": source.take(f"{ours}.mlp.fc.weight", ff, d).t(),
            f"{theirs}.mlp.c_fc.bias": source.bias(f"{ours}.mlp.fc.bias", ff),
            f"{theirs}.mlp.c_proj.weight": source.take(f"{ours}.mlp.proj.weight", d, ff).t(),
            f"{theirs}.mlp.c_proj.bias": source.bias(f"{ours}.mlp.proj.bias", d),
        }
    state |= source.head("lm_head.weight", "data.token_embedding.weight")
    return {name: _owned(tensor) for name, tensor in state.items()}


def _llama_state(config: LlamaConfig, source: _Source) -> dict[str, torch.Tensor]:
    d, ff = config.d_model, config.d_ff
    kv = config.n_kv_head * (d // config.n_head)
    state = {
        "model.embed_tokens.weight": source.take(
            "data.token_embedding.weight", config.vocab_size, d
        ),
        "model.norm.weight": source.take("data.final_norm.weight", d),
    }
    for i in range(config.n_layer):
        ours, theirs = f"body.blocks.{i}", f"model.layers.{i}"
        q, k, v = torch.split(source.take(f"{ours}.attn.qkv.weight", d + 2 * kv, d), [d, kv, kv])
        gate, up = torch.split(source.take(f"{ours}.mlp.gate_up.weight", 2 * ff, d), [ff, ff])
        state |= {
            f"{theirs}.input_layernorm.weight": source.take(f"{ours}.norm1.weight", d),
            f"{theirs}.self_attn.q_proj.weight": q,
            f"{theirs}.self_attn.k_proj.weight": k,
            f"{theirs}.self_attn.v_proj.weight": v,
            f"{theirs}.self_attn.o_proj.weight": source.take(f"{ours}.attn.proj.weight", d, d),
            f"{theirs}.post_attention_layernorm.weight": source.take(f"{ours}.norm2.weight", d),
            f"{theirs}.mlp.gate_proj.weight": gate,
            f"{theirs}.mlp.up_proj.weight": up,
            f"{theirs}.mlp.down_proj.weight": source.take(f"{ours}.mlp.proj.weight", d, ff),
        }
    state |= source.head("lm_head.weight", "data.token_embedding.weight")
    return {name: _owned(tensor) for name, tensor in state.items()}


class _Source:
    """The tensors not yet mapped: each is taken once, with its shape checked."""

    def __init__(
        self, tensors: dict[str, torch.Tensor], config: ModelConfig, dtype: torch.dtype
    ) -> None:
        self.left = tensors
        self.dtype = dtype
        self.taken: dict[str, torch.Tensor] = {}
        self.config = config

    def take(self, name: str, *shape: int) -> torch.Tensor:
        tensor = self.left.pop(name, None)
        if tensor is None:
            raise ExportError(f"the model's tensors lack {name}; the parts gathered are not whole")
        if tuple(tensor.shape) != shape:
            raise ExportError(
                f"tensor {name} has shape {tuple(tensor.shape)}, the model config says {shape}"
            )
        self.taken[name] = tensor
        return tensor

    def bias(self, name: str, size: int) -> torch.Tensor:
        """A bias of a GPT model, or zeros in its place when the model has none."""
        if isinstance(self.config, GPTConfig) and not self.config.bias:
            return torch.zeros(size, dtype=self.dtype)
        return self.take(name, size)

    def head(self, hf_name: str, embedding: str) -> dict[str, torch.Tensor]:
        """The LM head: its own weight, or nothing when it is the (tied) embedding."""
        shape = (self.config.vocab_size, self.config.d_model)
        if not self.config.tie_embeddings:
            return {hf_name: self.take("data.head.weight", *shape)}
        head = self.left.pop("data.head.weight", None)
        if head is not None and not torch.equal(head, self.taken[embedding]):
            raise ExportError("the model ties its head to the embedding, but the two differ")
        return {}

    def finish(self) -> None:
        if self.left:
            extra = ", ".join(sorted(self.left)[:4])
            raise ExportError(
                f"{len(self.left)} tensors have no place in the exported layout ({extra}…): "
                "they are not of this model config"
            )


def _refuse_unknown_fields(config: ModelConfig) -> None:
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(fields - _KNOWN_FIELDS.get(config.family, set()))
    if unknown:
        layout = "GPT-2" if config.family == "gpt" else "Llama"
        raise ExportError(
            f"model config field(s) {', '.join(unknown)} of the {config.family} family have no "
            f"counterpart in the {layout} layout the export writes; exporting would drop them"
        )


def _one_dtype(tensors: Mapping[str, torch.Tensor]) -> torch.dtype:
    dtypes = {tensor.dtype for tensor in tensors.values()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
        names = sorted(str(dtype) for dtype in dtypes)
        raise ExportError(f"the model's tensors must share one float dtype, found {names}")
    return next(iter(dtypes))


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy: a transpose or a split is a view, and safetensors refuses tensors
    that share memory."""
    return tensor.detach().clone(memory_format=torch.contiguous_format)
