"""The transformer modules of both families and the three things built from them: the data-node
part (embeddings, final norm, LM head, loss), a relay stage (a contiguous run of blocks) and the
whole model (the reference that the split engine must agree with).

Initialisation is seeded per layer (``part_seed``): block ``i`` gets the same weights whether it is
built inside the whole model or inside any stage, which is what lets a split model be compared with
the whole one and lets every replica of a stage start identical without a download.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from gwtf.node.training.config import GPTConfig, ModelConfig, validate_config

#: Standard deviation of every weight matrix and embedding at initialisation (GPT-2's value).
INIT_STD = 0.02


def part_seed(seed: int, kind: str, index: int = 0) -> int:
    """A 63-bit seed for one piece of the model, independent of which part builds it."""
    digest = hashlib.blake2b(f"{seed}/{kind}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half form) for queries and keys of shape (B, H, T, hd)."""

    def __init__(self, head_size: int, block_size: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
        angles = torch.outer(torch.arange(block_size, dtype=torch.float64), inv_freq)  # (T, hd/2)
        angles = torch.cat([angles, angles], dim=-1)  # (T, hd)
        # Not persistent: derived from the config, so never part of a checkpoint.
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq_len = x.shape[-2]
        cos = self.cos[:seq_len].to(x.dtype)
        sin = self.sin[:seq_len].to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention with optional grouped-query heads and rotary positions."""

    def __init__(
        self, d_model: int, n_head: int, n_kv_head: int, bias: bool, rotary: Rotary | None
    ) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_size = d_model // n_head
        kv_size = n_kv_head * self.head_size
        self.qkv = nn.Linear(d_model, d_model + 2 * kv_size, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        kv_size = self.n_kv_head * self.head_size
        q, k, v = self.qkv(x).split([d_model, kv_size, kv_size], dim=-1)
        q = q.view(batch, seq_len, self.n_head, self.head_size).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(batch, seq_len, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, KV, T, hd)
        v = v.view(batch, seq_len, self.n_kv_head, self.head_size).transpose(1, 2)  # (B, KV, T, hd)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        grouped = self.n_kv_head != self.n_head
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
        y = y.transpose(1, 2).reshape(batch, seq_len, d_model)  # (B, T, C)
        out: torch.Tensor = self.proj(y)  # (B, T, C)
        return out


class GeluMLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff, bias=bias)
        self.proj = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(F.gelu(self.fc(x)))  # (B, T, C) -> (B, T, 4C) -> (B, T, C)
        return out


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * d_ff, bias=False)
        self.proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, F) each
        out: torch.Tensor = self.proj(F.silu(gate) * up)  # (B, T, C)
        return out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm1: nn.Module
        self.norm2: nn.Module
        self.mlp: nn.Module
        if isinstance(config, GPTConfig):
            self.norm1 = nn.LayerNorm(config.d_model, bias=config.bias)
            self.norm2 = nn.LayerNorm(config.d_model, bias=config.bias)
            self.attn = CausalSelfAttention(
                config.d_model, config.n_head, config.n_head, config.bias, rotary=None
            )
            self.mlp = GeluMLP(config.d_model, config.d_ff, config.bias)
        else:
            head_size = config.d_model // config.n_head
            rotary = Rotary(head_size, config.block_size, config.rope_theta)
            self.norm1 = nn.RMSNorm(config.d_model, eps=config.norm_eps)
            self.norm2 = nn.RMSNorm(config.d_model, eps=config.norm_eps)
            self.attn = CausalSelfAttention(
                config.d_model, config.n_head, config.n_kv_head, False, rotary
            )
            self.mlp = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


@torch.no_grad()
def init_weights_(module: nn.Module, seed: int, residual_std: float) -> None:
    """Seeded init: matrices N(0, 0.02) (output projections ``residual_std``), biases 0,
    norm gains 1. Runs in float32 on CPU so every device and dtype starts from the same values."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in module.named_parameters():
        if param.dim() < 2:
            is_gain = name.endswith("weight") and isinstance(
                _owner(module, name), nn.LayerNorm | nn.RMSNorm
            )
            param.fill_(1.0 if is_gain else 0.0)
            continue
        std = residual_std if name.endswith("proj.weight") else INIT_STD
        values = torch.empty(param.shape, dtype=torch.float32).normal_(
            0.0, std, generator=generator
        )
        param.copy_(values)


def _owner(module: nn.Module, param_name: str) -> nn.Module:
    return module.get_submodule(param_name.rpartition(".")[0])


class DataPart(nn.Module):
    """What a data node holds: token (and for GPT position) embeddings, the final norm, the LM
    head and the loss. The head may share the token embedding's weight: both live here."""

    def __init__(self, config: ModelConfig, seed: int) -> None:
        super().__init__()
        validate_config(config)
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding: nn.Embedding | None = None
        self.final_norm: nn.Module
        if isinstance(config, GPTConfig):
            self.position_embedding = nn.Embedding(config.block_size, config.d_model)
            self.final_norm = nn.LayerNorm(config.d_model, bias=config.bias)
        else:
            self.final_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_weights_(self.token_embedding, part_seed(seed, "token_embedding"), INIT_STD)
        init_weights_(self.final_norm, part_seed(seed, "final_norm"), INIT_STD)
        if self.position_embedding is not None:
            init_weights_(self.position_embedding, part_seed(seed, "positions"), INIT_STD)
        if config.tie_embeddings:
            self.head.weight = self.token_embedding.weight
        else:
            init_weights_(self.head, part_seed(seed, "head"), INIT_STD)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.token_embedding(tokens)  # (B, T) -> (B, T, C)
        if self.position_embedding is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = x + self.position_embedding(positions)  # (T, C) broadcast over B
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.final_norm(x))  # (B, T, C) -> (B, T, V)
        return out

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every token of the microbatch; x is (B, T, C)."""
        logits = self.logits(x)  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class Stage(nn.Module):
    """A relay stage: blocks ``first_layer .. end_layer - 1`` of the model, applied in order."""

    def __init__(self, config: ModelConfig, first_layer: int, end_layer: int, seed: int) -> None:
        super().__init__()
        validate_config(config)
        self.config = config
        self.first_layer, self.end_layer = first_layer, end_layer
        residual_std = INIT_STD / math.sqrt(2 * config.n_layer)
        blocks = []
        for layer in range(first_layer, end_layer):
            block = Block(config)
            init_weights_(block, part_seed(seed, "block", layer), residual_std)
            blocks.append(block)
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)  # (B, T, C) -> (B, T, C)
        return x


class WholeModel(nn.Module):
    """The unsplit model: the reference the pipeline is proven against, and the benchmark's
    baseline. Built from the same parts with the same seeds as a split model."""

    def __init__(self, config: ModelConfig, seed: int) -> None:
        super().__init__()
        self.config = config
        self.data = DataPart(config, seed)
        self.body = Stage(config, 0, config.n_layer, seed)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.body(self.data.embed(tokens))  # (B, T, C)
        return self.data.loss(x, targets)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, T, V) of ``tokens`` (B, T)."""
        return self.data.logits(self.body(self.data.embed(tokens)))
