"""DT-FM's scheduler: a genetic search over its communication cost model.

DT-FM (Yuan et al., "Decentralized Training of Foundation Models in Heterogeneous Environments",
NeurIPS 2022) splits the devices into S groups of D (data-parallel replicas of one stage each),
orders the groups along the pipeline and matches one device per group into D pipelines, choosing
the layout that minimises a communication cost:

    cost = max over groups of the group's all-reduce time (data parallelism)
         + max over pipelines of its activation traffic for one iteration (pipeline parallelism)

Like the original, the model counts communication only (DT-FM assumes identical GPUs). The search
is a genetic algorithm over permutations (population 100 as in the paper; tournament selection,
order crossover, swap mutation, elitism). Two modes: ``full`` chooses the groups (and so moves
relays between stages), ``match`` keeps every relay in its stage and only re-matches pipelines.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gwtf.coordinator_free.sim.policy import WorldView

POPULATION = 100
GENERATIONS = 30
TOURNAMENT = 3
MUTATION_RATE = 0.3
ELITE = 2


@dataclass(frozen=True)
class Schedule:
    """Pipelines (one relay per stage, in stage order), the spare relays, and the model's cost."""

    pipelines: tuple[tuple[str, ...], ...]
    spares: tuple[str, ...]
    cost_s: float

    def stage_of(self) -> dict[str, int]:
        return {relay: k + 1 for p in self.pipelines for k, relay in enumerate(p)}


class CostModel:
    """DT-FM's communication cost of a layout, with the link times precomputed."""

    def __init__(
        self, world: WorldView, relays: Sequence[str], microbatches: int, data: Sequence[str]
    ) -> None:
        nodes = list(relays) + list(data)
        bits = world.activation_bytes * 8.0
        self._hop_s = {
            (a, b): world.latency_ms(a, b) / 1000.0 + bits / (world.bandwidth_gbps(a, b) * 1e9)
            for a in nodes
            for b in nodes
        }
        self._latency_s = {(a, b): world.latency_ms(a, b) / 1000.0 for a in nodes for b in nodes}
        self._bw = {(a, b): world.bandwidth_gbps(a, b) * 1e9 for a in nodes for b in nodes}
        self._param_bits = world.stage_param_bytes * 8.0
        self._microbatches = microbatches
        self._data = list(data)

    def cost(self, groups: Sequence[Sequence[str]]) -> float:
        if not groups or not groups[0]:
            return float("inf")
        width = len(groups[0])
        dp = max(self._allreduce_s(g) for g in groups)
        per_pipeline = self._microbatches / width
        pp = 0.0
        for i in range(width):
            origin = self._data[i % len(self._data)]
            hops = [origin, *(g[i] for g in groups), origin]
            seconds = sum(self._hop_s[a, b] for a, b in itertools.pairwise(hops))
            pp = max(pp, 2.0 * seconds * per_pipeline)  # forward activations + backward grads
        return dp + pp

    def _allreduce_s(self, group: Sequence[str]) -> float:
        n = len(group)
        if n < 2:
            return 0.0
        ring = list(zip(group, [*group[1:], group[0]], strict=True))
        bandwidth = min(self._bw[a, b] for a, b in ring)
        latency = max(self._latency_s[a, b] for a, b in ring)
        return 2.0 * (n - 1) * (self._param_bits / n / bandwidth + latency)


def search_schedule(
    world: WorldView,
    blocks: Sequence[Sequence[str]],
    microbatches: int,
    rng: random.Random,
    generations: int = GENERATIONS,
) -> Schedule | None:
    """Run the genetic search; ``blocks`` is ``[all relays]`` (full) or one list per stage (match).

    Returns None when there are too few relays for one pipeline.
    """
    stages = world.stages
    data = list(world.data_nodes())
    relays = [r for block in blocks for r in block]
    full = len(blocks) == 1
    if (full and len(relays) < stages) or (not full and min(map(len, blocks), default=0) == 0):
        return None
    model = CostModel(world, relays, microbatches, data)

    def decode(genome: list[list[str]]) -> tuple[list[list[str]], list[str]]:
        if full:
            flat = genome[0]
            width = len(flat) // stages
            groups = [flat[k * width : (k + 1) * width] for k in range(stages)]
            return groups, flat[stages * width :]
        width = min(len(b) for b in genome)
        return [b[:width] for b in genome], [r for b in genome for r in b[width:]]

    def fitness(genome: list[list[str]]) -> float:
        return model.cost(decode(genome)[0])

    population = [[list(b) for b in blocks]]
    while len(population) < POPULATION:
        population.append([rng.sample(list(b), len(b)) for b in blocks])
    scored = sorted(((fitness(g), i, g) for i, g in enumerate(population)), key=lambda t: t[:2])
    counter = len(population)
    for _ in range(generations):
        children = [g for _, _, g in scored[:ELITE]]
        while len(children) < POPULATION:
            mother = _tournament(scored, rng)
            father = _tournament(scored, rng)
            child = [_order_crossover(a, b, rng) for a, b in zip(mother, father, strict=True)]
            if rng.random() < MUTATION_RATE:
                _swap_mutation(child, rng)
            children.append(child)
        scored = []
        for child in children:
            counter += 1
            scored.append((fitness(child), counter, child))
        scored.sort(key=lambda t: t[:2])
    best_cost, _, best = scored[0]
    groups, spares = decode(best)
    pipelines = tuple(tuple(g[i] for g in groups) for i in range(len(groups[0])))
    return Schedule(pipelines, tuple(spares), best_cost)


def random_schedule_cost(
    world: WorldView, relays: Sequence[str], microbatches: int, rng: random.Random
) -> float:
    """Cost of a uniformly random full layout (the yardstick the search must beat)."""
    stages = world.stages
    flat = rng.sample(list(relays), len(relays))
    width = len(flat) // stages
    groups = [flat[k * width : (k + 1) * width] for k in range(stages)]
    return CostModel(world, relays, microbatches, list(world.data_nodes())).cost(groups)


def _tournament(
    scored: list[tuple[float, int, list[list[str]]]], rng: random.Random
) -> list[list[str]]:
    picks = [scored[rng.randrange(len(scored))] for _ in range(TOURNAMENT)]
    return min(picks, key=lambda t: t[:2])[2]


def _order_crossover(mother: list[str], father: list[str], rng: random.Random) -> list[str]:
    """OX1: keep a slice of the mother, fill the rest in the father's order."""
    size = len(mother)
    if size < 2:
        return list(mother)
    lo, hi = sorted(rng.sample(range(size + 1), 2))
    kept = set(mother[lo:hi])
    rest = [r for r in father if r not in kept]
    return rest[:lo] + mother[lo:hi] + rest[lo:]


def _swap_mutation(genome: list[list[str]], rng: random.Random) -> None:
    block = genome[rng.randrange(len(genome))]
    if len(block) >= 2:
        i, j = rng.sample(range(len(block)), 2)
        block[i], block[j] = block[j], block[i]
