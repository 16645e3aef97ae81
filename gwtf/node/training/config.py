"""Model configurations of the two families, their named sizes and analytic parameter counts.

A config is a frozen dataclass: it is hashed into the run (``config_digest``) and the partition is a
pure function of it, so every node derives the same stages without building any weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Literal

from gwtf.node.training.errors import ModelConfigError

#: The byte-level tokenizer's vocabulary (gwtf.node.training.data); every named size uses it.
BYTE_VOCAB_SIZE = 256


@dataclass(frozen=True)
class GPTConfig:
    """GPT-2-like: LayerNorm, learned absolute positions, GELU MLP, biases optional."""

    n_layer: int
    n_head: int
    d_model: int
    block_size: int
    vocab_size: int = BYTE_VOCAB_SIZE
    bias: bool = True
    tie_embeddings: bool = True
    family: Literal["gpt"] = "gpt"

    @property
    def d_ff(self) -> int:
        return 4 * self.d_model


@dataclass(frozen=True)
class LlamaConfig:
    """LLaMA-like: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention when
    ``n_kv_head < n_head``; no biases."""

    n_layer: int
    n_head: int
    n_kv_head: int
    d_model: int
    d_ff: int
    block_size: int
    vocab_size: int = BYTE_VOCAB_SIZE
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    family: Literal["llama"] = "llama"


ModelConfig = GPTConfig | LlamaConfig

GPT_SIZES: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=4, n_head=4, d_model=64, block_size=64),
    "small": GPTConfig(n_layer=6, n_head=8, d_model=256, block_size=128),
    "125m": GPTConfig(n_layer=12, n_head=12, d_model=768, block_size=1024),
    "350m": GPTConfig(n_layer=24, n_head=16, d_model=1024, block_size=1024),
    "1b": GPTConfig(n_layer=20, n_head=16, d_model=2048, block_size=2048),
}

LLAMA_SIZES: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(n_layer=4, n_head=4, n_kv_head=2, d_model=64, d_ff=176, block_size=64),
    "small": LlamaConfig(n_layer=6, n_head=8, n_kv_head=4, d_model=256, d_ff=688, block_size=128),
    "125m": LlamaConfig(
        n_layer=12, n_head=12, n_kv_head=4, d_model=768, d_ff=2048, block_size=1024
    ),
    "350m": LlamaConfig(
        n_layer=24, n_head=16, n_kv_head=8, d_model=1024, d_ff=2816, block_size=1024
    ),
    # TinyLlama-1.1B's shape.
    "1b": LlamaConfig(n_layer=22, n_head=32, n_kv_head=4, d_model=2048, d_ff=5632, block_size=2048),
}


def named_config(family: str, size: str) -> ModelConfig:
    """The config of a named size, e.g. ``named_config("llama", "tiny")``."""
    table: dict[str, GPTConfig] | dict[str, LlamaConfig]
    if family == "gpt":
        table = GPT_SIZES
    elif family == "llama":
        table = LLAMA_SIZES
    else:
        raise ModelConfigError(f"unknown model family {family!r}; use 'gpt' or 'llama'")
    if size not in table:
        raise ModelConfigError(f"unknown {family} size {size!r}; choose one of {sorted(table)}")
    return table[size]


def validate_config(config: ModelConfig) -> None:
    """Refuse a config the modules cannot build, naming the bad value."""
    positive = {
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "d_model": config.d_model,
        "block_size": config.block_size,
        "vocab_size": config.vocab_size,
    }
    for name, value in positive.items():
        if value < 1:
            raise ModelConfigError(f"model config {name}={value} must be at least 1")
    if config.d_model % config.n_head:
        raise ModelConfigError(
            f"d_model={config.d_model} must be a multiple of n_head={config.n_head}"
        )
    if isinstance(config, LlamaConfig):
        if config.n_kv_head < 1 or config.n_head % config.n_kv_head:
            raise ModelConfigError(
                f"n_kv_head={config.n_kv_head} must divide n_head={config.n_head}"
            )
        if (config.d_model // config.n_head) % 2:
            raise ModelConfigError("rotary positions need an even head size (d_model / n_head)")


def block_param_count(config: ModelConfig) -> int:
    """Parameters of one transformer block (all blocks of a config have the same count)."""
    d = config.d_model
    if isinstance(config, GPTConfig):
        b = 1 if config.bias else 0
        norms = 2 * (d + b * d)
        attention = d * 3 * d + b * 3 * d + d * d + b * d
        mlp = d * config.d_ff + b * config.d_ff + config.d_ff * d + b * d
        return norms + attention + mlp
    d_kv = config.n_kv_head * (d // config.n_head)
    attention = 2 * d * d + 2 * d * d_kv
    return 2 * d + attention + 3 * d * config.d_ff


def data_part_param_count(config: ModelConfig) -> int:
    """Parameters of the data-node part: embeddings, final norm and LM head."""
    d = config.d_model
    head = 0 if config.tie_embeddings else config.vocab_size * d
    if isinstance(config, GPTConfig):
        norm = d + (d if config.bias else 0)
        return config.vocab_size * d + config.block_size * d + norm + head
    return config.vocab_size * d + d + head


def total_param_count(config: ModelConfig) -> int:
    return data_part_param_count(config) + config.n_layer * block_param_count(config)


def config_digest(config: ModelConfig) -> str:
    """A stable hex digest of the config, the ``model config hash`` a run commits to."""
    canonical = json.dumps(dataclasses.asdict(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def config_from_dict(raw: dict[str, object]) -> ModelConfig:
    """Rebuild a config from ``dataclasses.asdict`` output (a checkpoint header, a run file)."""
    family = raw.get("family")
    cls: type[GPTConfig] | type[LlamaConfig]
    if family == "gpt":
        cls = GPTConfig
    elif family == "llama":
        cls = LlamaConfig
    else:
        raise ModelConfigError(f"model config has unknown family {family!r}; use 'gpt' or 'llama'")
    names = {f.name for f in dataclasses.fields(cls)}
    if set(raw) != names:
        raise ModelConfigError(f"{family} config fields must be exactly {sorted(names)}")
    try:
        config = cls(**raw)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ModelConfigError(f"model config is malformed: {exc}") from exc
    validate_config(config)
    return config
