"""Configs, analytic parameter counts, the partition and per-layer deterministic initialisation."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf.node.training.config import (
    GPTConfig,
    LlamaConfig,
    block_param_count,
    config_digest,
    config_from_dict,
    data_part_param_count,
    named_config,
    total_param_count,
)
from gwtf.node.training.errors import ModelConfigError
from gwtf.node.training.model import Block, DataPart, Rotary, Stage, WholeModel
from gwtf.node.training.partition import balance_contiguous, plan_partition


@pytest.mark.parametrize(
    ("family", "size"), [("gpt", "tiny"), ("gpt", "small"), ("llama", "tiny"), ("llama", "small")]
)
def test_analytic_counts_match_built_modules(family: str, size: str) -> None:
    config = named_config(family, size)
    data = DataPart(config, seed=0)
    stage = Stage(config, 0, 1, seed=0)
    assert sum(p.numel() for p in data.parameters()) == data_part_param_count(config)
    assert sum(p.numel() for p in stage.parameters()) == block_param_count(config)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_named_sizes_reach_about_a_billion_parameters(family: str) -> None:
    counts = [
        total_param_count(named_config(family, size))
        for size in ("tiny", "small", "125m", "350m", "1b")
    ]
    assert counts == sorted(counts)
    assert counts[0] < 500_000
    assert 0.9e9 < counts[-1] < 1.3e9


def test_unknown_names_and_bad_configs_are_refused() -> None:
    with pytest.raises(ModelConfigError, match="family"):
        named_config("bert", "tiny")
    with pytest.raises(ModelConfigError, match="choose one of"):
        named_config("gpt", "huge")
    with pytest.raises(ModelConfigError, match="multiple of n_head"):
        DataPart(GPTConfig(n_layer=1, n_head=3, d_model=64, block_size=8), seed=0)
    with pytest.raises(ModelConfigError, match="n_kv_head"):
        Stage(
            LlamaConfig(n_layer=1, n_head=4, n_kv_head=3, d_model=64, d_ff=8, block_size=8), 0, 1, 0
        )


def test_config_digest_is_stable_and_round_trips() -> None:
    import dataclasses

    config = named_config("llama", "small")
    assert config_from_dict(dataclasses.asdict(config)) == config
    assert config_digest(config) == config_digest(named_config("llama", "small"))
    assert config_digest(config) != config_digest(named_config("gpt", "small"))
    with pytest.raises(ModelConfigError):
        config_from_dict({"family": "gpt", "n_layer": 1})


def brute_force_heaviest(weights: list[int], parts: int) -> int:
    best = sum(weights)
    for cuts in itertools.combinations(range(1, len(weights)), parts - 1):
        bounds = (0, *cuts, len(weights))
        best = min(best, max(sum(weights[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=9), st.data())
def test_balance_contiguous_is_optimal(weights: list[int], data: st.DataObject) -> None:
    parts = data.draw(st.integers(min_value=1, max_value=len(weights)))
    sizes = balance_contiguous(weights, parts)
    assert len(sizes) == parts and all(size >= 1 for size in sizes) and sum(sizes) == len(weights)
    starts = list(itertools.accumulate((0, *sizes)))
    heaviest = max(sum(weights[a:b]) for a, b in itertools.pairwise(starts))
    assert heaviest == brute_force_heaviest(weights, parts)


def test_plan_balances_or_follows_explicit_counts() -> None:
    config = named_config("gpt", "350m")  # 24 layers
    plan = plan_partition(config, 5)
    assert [span.n_layers for span in plan.stages] == [4, 5, 5, 5, 5] or max(
        span.n_layers for span in plan.stages
    ) - min(span.n_layers for span in plan.stages) <= 1
    assert plan.stages[0].first_layer == 0 and plan.stages[-1].end_layer == 24
    assert all(a.end_layer == b.first_layer for a, b in itertools.pairwise(plan.stages))
    explicit = plan_partition(config, 3, [2, 20, 2])
    assert [(s.first_layer, s.end_layer) for s in explicit.stages] == [(0, 2), (2, 22), (22, 24)]
    for bad in ([2, 20], [0, 22, 2], [2, 2, 2]):
        with pytest.raises(ModelConfigError, match="layers_per_stage"):
            plan_partition(config, 3, bad)
    with pytest.raises(ModelConfigError, match="non-empty"):
        plan_partition(config, 25)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_a_layer_has_the_same_weights_in_the_whole_model_and_in_a_stage(family: str) -> None:
    config = named_config(family, "tiny")
    whole = WholeModel(config, seed=3).state_dict()
    stage = Stage(config, 2, 4, seed=3).state_dict()
    data = DataPart(config, seed=3).state_dict()
    for name, value in stage.items():
        _, local, rest = name.split(".", 2)
        assert torch.equal(whole[f"body.blocks.{int(local) + 2}.{rest}"], value)
    for name, value in data.items():
        assert torch.equal(whole[f"data.{name}"], value)
    other_seed = Stage(config, 2, 4, seed=4).state_dict()
    assert not torch.equal(
        other_seed["blocks.0.attn.qkv.weight"], stage["blocks.0.attn.qkv.weight"]
    )
    block0, block1 = whole["body.blocks.0.attn.qkv.weight"], whole["body.blocks.1.attn.qkv.weight"]
    assert not torch.equal(block0, block1)


def test_tying_lives_only_on_the_data_node() -> None:
    gpt = DataPart(named_config("gpt", "tiny"), seed=0)
    llama = DataPart(named_config("llama", "tiny"), seed=0)
    assert gpt.head.weight is gpt.token_embedding.weight
    assert llama.head.weight is not llama.token_embedding.weight


def test_norm_gains_start_at_one_and_biases_at_zero() -> None:
    block = Stage(named_config("gpt", "tiny"), 0, 1, seed=0).blocks[0]
    assert isinstance(block, Block)
    params = dict(block.named_parameters())
    assert torch.equal(params["norm1.weight"], torch.ones(64))
    assert torch.equal(params["norm1.bias"], torch.zeros(64))
    assert torch.equal(params["attn.qkv.bias"], torch.zeros(192))


def test_attention_is_causal() -> None:
    stage = Stage(named_config("llama", "tiny"), 0, 2, seed=1).double()
    x = torch.randn(1, 10, 64, dtype=torch.float64)
    changed = x.clone()
    changed[:, 6:] += 1.0
    assert torch.equal(stage(x)[:, :6], stage(changed)[:, :6])
    assert not torch.equal(stage(x)[:, 6:], stage(changed)[:, 6:])


def test_rotary_scores_depend_only_on_relative_position() -> None:
    rotary = Rotary(head_size=8, block_size=32, theta=10000.0).double()
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)

    def score(q_pos: int, k_pos: int) -> float:
        qs = torch.zeros(32, 8, dtype=torch.float64)
        ks = torch.zeros(32, 8, dtype=torch.float64)
        qs[q_pos], ks[k_pos] = q, k
        return float(rotary(qs)[q_pos] @ rotary(ks)[k_pos])

    assert score(9, 4) == pytest.approx(score(25, 20), rel=1e-5)  # float32 tables
    assert score(9, 4) != pytest.approx(score(9, 5), rel=1e-3)
    assert torch.allclose(
        rotary(qs := torch.randn(32, 8, dtype=torch.float64)).norm(dim=-1), qs.norm(dim=-1)
    )
