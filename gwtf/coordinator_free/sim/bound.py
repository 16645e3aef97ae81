"""A lower bound on a scenario's simulated training time that no routing policy can beat.

``lower_bound(scenario)`` reads only the scenario: it holds for every placement, routing, repair
and churn outcome the engine (the model stated in ``policy.py``) allows, so a run that finishes
never takes less than ``Bound.total_s``. It is what ``baselines/central.py``, a strong heuristic,
cannot claim to be; the gap between a run and the bound is what any algorithm could still gain.

**Counted microbatches.** Relays crash at random, data nodes only by the scenario's events
(``_on_crash`` abandons the microbatches of a crashed origin, which shrinks an iteration's
work). A data node present at time 0 whose first crash event is at ``c`` (∞ without one) is up
for the whole of any run that ends before ``c``: it injects its ``capacity`` microbatches in
every iteration and none of them is abandoned. So for any ``τ``, a run lasts at least
``min(τ, bound with the data nodes of c ≥ τ counted)``; the bound is the best such ``τ`` among
the crash times and ∞. ``B`` below is the counted nodes' summed capacity; the rest of the work
(other data nodes, restarts, repairs, superseded hops) only adds load and is left out.

**The chain of a counted microbatch.** Its final attempt starts at or after the iteration's
start ``s`` and is complete before the barrier ``e``. Whatever the recoveries, that attempt
holds, in this order: a transfer into stage 1 (from its origin: relays send only to later
stages), for each stage a completed forward task (``c/3`` of work, ``c`` = ``stage_compute_ms``
at speed 1), a transfer into the sink, the sink's task (``c`` on a data node), a transfer
into stage S, for each stage a completed backward (``2c/3``) or repair (``c``) task, and a
transfer into the origin; the origin completes it on arrival, so no ack is on the path. (A
forward whose ack is still in flight at its deadline is sent again from the sender's stage; the
chain counts only the final attempt's tasks and transfers.) Each transfer takes at least the
cheapest ``bytes/bandwidth + latency`` over the region pairs its kind (data → relay, relay →
relay, relay → data) can use; a relay → relay step counts the cheaper of that and relay → data
→ relay, the way a client-routed policy (SWARM) takes it. Each node runs one task at a
time and a crash drops its unfinished tasks, so completed tasks on a node never overlap.

A run takes exactly Σ over iterations of ``e - s`` plus that iteration's averaging (the next
starts when the averaging ends), and every counted microbatch repeats in each. ``IterationBound``
gives the terms of one iteration with every relay up, ``iterations × total_s`` of them a bound
without relay churn; ``bound_run.py`` runs the iterations one after another over the relays'
lives (``bound_lives.py``: when each is up, replayed from the churn schedule), so a relay that
is down is not credited, and that run is the bound. Per iteration, ``e - s`` is at least each of:

* ``critical_path_s``: the chain itself, every task at the fastest speed of its role.
* ``compute_s``: tasks of stages j..S lie between the earliest start of a stage-j forward and
  the latest end of a stage-j backward, ``h_j`` (the chain's fixed parts outside that span)
  inside the iteration, and carry ``(S-j+1)·B·c`` of work, so ``e - s ≥ h_j +
  (S-j+1)·B·c / Σ speed`` over the relays (up for the whole iteration here; ``bound_run.py``
  integrates the speed of those up). A relay keeps its stage for a whole life within an
  iteration (``MoveStage`` acts between them; one brought up again is placed anew), so the
  relays of stage j alone, of summed speed σ_j, do its ``B·c``: ``e - s ≥ h_j + B·c/σ_j``
  with ``Σ σ_j ≤ Σ speed``; the least ``λ`` meeting this for some split (a continuous
  relaxation of every placement) is a bound too.
* ``sink_s``: the ``B`` sink tasks lie on data nodes after the chain's forward part and before
  its backward part, hence ``critical_path_s - c/v_data + B·c / Σ data speed``.
* ``uplink_s``: an uplink sends one transfer at a time, each at least ``bytes`` over its best
  bandwidth to a possible receiver. A chain has ``2S+2`` transfers, two of them from data
  nodes (the origin's first forward, the sink's first backward). A node brought up again resets
  its uplink while its old queue still delivers, so an uplink counts only if its node cannot
  come back: all of them (``2S+2`` each) or the data nodes' alone (2 each).

Between iterations the engine averages (``iterations._allreduce_s``): the max over stages of a
butterfly all-reduce among live replicas, at least the data nodes' (``data_allreduce_s``):
exactly ``butterfly_allreduce_s`` of every data node when all are counted and none can join;
otherwise, as the butterfly is not monotone in its members, its floor over any live superset of
the m counted ones: ``2·(largest latency between two counted + (m-1)/m · P / best bandwidth)``.
``relay_allreduce_s``: every live relay is placed (the engine refuses an unplaced one and
places a joiner on arrival), so with ``n`` relays up at the barrier some stage has ``⌈n/S⌉``
live replicas and its butterfly takes at least ``2·((k-1)/k · P / best relay bandwidth + least
relay latency)`` for k of them; ``IterationBound`` counts the relays no churn touches,
``bound_run.py`` the fewest up at any time from the iteration's earliest barrier on.

Dropped as unsound: relay memory (slot-time) bounds, because a repair is admitted over capacity
(a client-routed policy such as SWARM repairs every backward), and a crash or a late-acked
re-send frees a slot whose microbatch still comes back; uplink bounds over nodes that may come
back; any cost of a crash beyond the lost capacity (what a crashed relay held, detection), which
a policy with full knowledge and an idle victim need not pay. The total is multiplied by
``1 - 1e-9`` so float rounding never lifts it above a run that meets it exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gwtf.coordinator_free.sim.bound_lives import relay_lives
from gwtf.coordinator_free.sim.bound_run import Chain, run_s
from gwtf.coordinator_free.sim.events import FORWARD_SHARE
from gwtf.coordinator_free.sim.iterations import butterfly_allreduce_s
from gwtf.coordinator_free.sim.scenario import NodeEntry, Scenario
from gwtf.coordinator_free.sim.world import BITS_PER_BYTE

_BITS_PER_GBIT = 1e9
#: The engine sums floats in another order; a run that meets the bound exactly may differ by ulps.
_ROUNDING_SLACK = 1e-9
#: Bisection steps for the per-stage relaxation: 2^-100 of the bracket, far below a nanosecond.
_BISECTION_STEPS = 100
#: Past this many times the churn-free run, a horizon stops doubling (no relay may be left).
_HORIZON_GROWTH_LIMIT = 64.0
#: A run over the lives this much above the churn-free one is said to be lifted by them.
_LIVES_MARGIN = 1e-3


@dataclass(frozen=True)
class IterationBound:
    """What any iteration takes at least, term by term (seconds); the module docstring argues
    each. ``microbatches`` is ``B``, the counted data nodes' summed capacity."""

    microbatches: int
    compute_s: float
    sink_s: float
    uplink_s: float
    critical_path_s: float
    data_allreduce_s: float
    relay_allreduce_s: float

    @property
    def work_s(self) -> float:
        """From the iteration's start to its barrier."""
        return max(self.compute_s, self.sink_s, self.uplink_s, self.critical_path_s)

    @property
    def allreduce_s(self) -> float:
        return max(self.data_allreduce_s, self.relay_allreduce_s)

    @property
    def total_s(self) -> float:
        return self.work_s + self.allreduce_s

    @property
    def binding(self) -> str:
        """The work term that sets ``work_s`` (the first of equals, in field order)."""
        terms = {
            "compute_s": self.compute_s,
            "sink_s": self.sink_s,
            "uplink_s": self.uplink_s,
            "critical_path_s": self.critical_path_s,
        }
        return max(terms, key=lambda name: terms[name])


@dataclass(frozen=True)
class Bound:
    """A scenario's training time is at least ``total_s``.

    ``per_iteration`` holds with the data nodes ``counted`` (up for the whole of any run shorter
    than ``horizon_s``) and every relay up; ``run_s`` is the run over the relays' lives
    (``bound_run.py``), at least ``iterations × per_iteration.total_s`` when no relay is ever
    down. ``horizon_s`` is None when the counted data nodes never crash, else the first crash
    among them, and ``total_s = min(horizon_s, run_s)`` less rounding.
    """

    total_s: float
    iterations: int
    per_iteration: IterationBound
    counted: tuple[str, ...]
    horizon_s: float | None
    run_s: float

    @property
    def binding(self) -> str:
        """``horizon_s`` if a counted data node's crash caps the bound, else the binding work
        term of an iteration, ``+lives`` when relays being down lifts the run above it."""
        if self.horizon_s is not None and self.horizon_s < self.run_s:
            return "horizon_s"
        static = self.iterations * self.per_iteration.total_s
        lifted = self.run_s > static * (1.0 + _LIVES_MARGIN)
        return self.per_iteration.binding + ("+lives" if lifted else "")


def lower_bound(scenario: Scenario) -> Bound:
    """The least simulated time any policy needs to finish ``scenario`` (see module docstring)."""
    crash_at = _first_data_crash_s(scenario)
    best: Bound | None = None
    for horizon in sorted(set(crash_at.values()) | {math.inf}):
        counted = tuple(n for n, c in crash_at.items() if c >= horizon)
        per_iteration = _iteration_bound(scenario, counted)
        work = _run_s(scenario, per_iteration, counted)
        total = min(horizon, work) * (1.0 - _ROUNDING_SLACK)
        if best is None or total > best.total_s:
            capped = None if horizon == math.inf else horizon
            best = Bound(total, scenario.iterations, per_iteration, counted, capped, work)
    assert best is not None, "a scenario has a data node"
    return best


def _run_s(scenario: Scenario, per_iteration: IterationBound, counted: Sequence[str]) -> float:
    """The whole run over the relays' lives (``bound_run.py``); lives are replayed up to a
    horizon ``H`` that doubles until the run ends before it (``min(H, run)`` bounds any run)."""
    relays = [e for e in scenario.nodes if e.role == "relay"]
    if per_iteration.microbatches == 0 or not relays:
        return scenario.iterations * per_iteration.total_s
    stages = scenario.model.stages
    stage_s = scenario.model.stage_compute_ms / 1000.0
    relay_stage_s = stage_s / max(e.speed for e in relays)
    data = [e for e in scenario.nodes if e.role == "data"]
    hops = _cheapest_hops(scenario, data, relays)
    forward_s = FORWARD_SHARE * relay_stage_s
    backward_s = (1.0 - FORWARD_SHARE) * relay_stage_s
    before = tuple(
        hops.data_to_relay_s + (j - 1) * (hops.relay_to_relay_s + forward_s)
        for j in range(1, stages + 1)
    )
    after = tuple(
        hops.relay_to_data_s + (j - 1) * (hops.relay_to_relay_s + backward_s)
        for j in range(1, stages + 1)
    )
    chain = Chain(
        before_s=before,
        after_s=after,
        work_s=per_iteration.microbatches * stage_s,
        least_s=max(per_iteration.sink_s, per_iteration.uplink_s, per_iteration.critical_path_s),
        data_allreduce_s=per_iteration.data_allreduce_s,
        relay_allreduce_s=lambda alive: _pigeonhole_allreduce_s(scenario, alive),
    )
    static = scenario.iterations * per_iteration.total_s
    horizon = 4.0 * static + 3600.0
    while True:
        lives = relay_lives(scenario, horizon)
        total = run_s(chain, lives, scenario.iterations, horizon)
        if total < horizon or horizon > _HORIZON_GROWTH_LIMIT * (static + 1.0):
            return total
        horizon *= 2.0


# ---- which nodes count ----


def _first_data_crash_s(scenario: Scenario) -> dict[str, float]:
    """Data nodes up at time 0 and the time of their first crash event (∞: none)."""
    joiners = {e.node for e in scenario.churn.events if e.event == "join"}
    crash_at = {e.id: math.inf for e in scenario.nodes if e.role == "data" and e.id not in joiners}
    for event in scenario.churn.events:
        if event.event == "crash" and event.node in crash_at:
            crash_at[event.node] = min(crash_at[event.node], event.t)
    return crash_at


def _may_come_back(scenario: Scenario) -> set[str]:
    """Nodes that may be brought up again after a crash (a second life, maybe elsewhere)."""
    churn = scenario.churn
    back: set[str] = set()
    if churn.rejoin and churn.crash_rate_per_hour > 0:
        back |= {e.id for e in scenario.nodes if e.role == "relay"}
    first_crash: dict[str, float] = {}
    for event in churn.events:  # sorted by time
        if event.event == "crash":
            first_crash.setdefault(event.node, event.t)
        elif event.node in first_crash:
            back.add(event.node)
    return back


def _always_up_relays(scenario: Scenario) -> list[NodeEntry]:
    """Relays up from time 0 to the end of every run: no random crashes and no events."""
    if scenario.churn.crash_rate_per_hour > 0:
        return []
    touched = {e.node for e in scenario.churn.events}
    return [e for e in scenario.nodes if e.role == "relay" and e.id not in touched]


# ---- one iteration ----


@dataclass(frozen=True)
class _Hops:
    """The cheapest transfer + latency (s) of each kind of hop."""

    data_to_relay_s: float
    relay_to_relay_s: float
    relay_to_data_s: float


def _iteration_bound(scenario: Scenario, counted_ids: Sequence[str]) -> IterationBound:
    counted_set = set(counted_ids)
    counted = [e for e in scenario.nodes if e.id in counted_set]
    data = [e for e in scenario.nodes if e.role == "data"]
    relays = [e for e in scenario.nodes if e.role == "relay"]
    data_allreduce = _data_allreduce_s(scenario, counted, data)
    relay_allreduce = _relay_allreduce_s(scenario, _always_up_relays(scenario))
    batch = sum(e.capacity for e in counted)
    if batch == 0:
        return IterationBound(0, 0.0, 0.0, 0.0, 0.0, data_allreduce, relay_allreduce)
    if not relays:  # no stage can be served: nothing ever finishes
        inf = math.inf
        return IterationBound(batch, inf, inf, inf, inf, data_allreduce, relay_allreduce)
    stages = scenario.model.stages
    stage_s = scenario.model.stage_compute_ms / 1000.0
    relay_stage_s = stage_s / max(e.speed for e in relays)
    hops = _cheapest_hops(scenario, data, relays)
    forward_s = FORWARD_SHARE * relay_stage_s
    backward_s = (1.0 - FORWARD_SHARE) * relay_stage_s
    relay_hops_s = (stages - 1) * hops.relay_to_relay_s
    before_sink = hops.data_to_relay_s + relay_hops_s + hops.relay_to_data_s + stages * forward_s
    after_sink = hops.data_to_relay_s + relay_hops_s + hops.relay_to_data_s + stages * backward_s
    fastest_sink_s = stage_s / max(e.speed for e in data)
    critical_path = before_sink + fastest_sink_s + after_sink
    sink = before_sink + after_sink + batch * stage_s / sum(e.speed for e in data)
    stage_fixed = not (_may_come_back(scenario) & {e.id for e in relays})
    compute = _compute_s(batch, stages, stage_s, relays, hops, relay_stage_s, stage_fixed)
    uplink = _uplink_s(scenario, batch, data, relays)
    return IterationBound(
        batch, compute, sink, uplink, critical_path, data_allreduce, relay_allreduce
    )


def _cheapest_hops(
    scenario: Scenario, data: Sequence[NodeEntry], relays: Sequence[NodeEntry]
) -> _Hops:
    data_regions = _regions(scenario, data)
    relay_regions = _regions(scenario, relays)
    data_to_relay_s = _cheapest_hop_s(scenario, data_regions, relay_regions)
    relay_to_data_s = _cheapest_hop_s(scenario, relay_regions, data_regions)
    # A client-routed policy (SWARM) passes a stage's output through its data node.
    direct_s = _cheapest_hop_s(scenario, relay_regions, relay_regions)
    return _Hops(
        data_to_relay_s=data_to_relay_s,
        relay_to_relay_s=min(direct_s, relay_to_data_s + data_to_relay_s),
        relay_to_data_s=relay_to_data_s,
    )


def _cheapest_hop_s(scenario: Scenario, sources: Iterable[int], targets: Iterable[int]) -> float:
    bits = scenario.model.activation_bytes * BITS_PER_BYTE
    topology = scenario.topology
    target_list = list(targets)
    return min(
        bits / (topology.bandwidth_gbps[a][b] * _BITS_PER_GBIT) + topology.latency_ms[a][b] / 1000.0
        for a in sources
        for b in target_list
    )


def _compute_s(
    batch: int,
    stages: int,
    stage_s: float,
    relays: Sequence[NodeEntry],
    hops: _Hops,
    relay_stage_s: float,
    stage_fixed: bool,
) -> float:
    """Relay compute: nested windows of stages j..S, and the per-stage split when stages hold."""
    speed = sum(e.speed for e in relays)
    # h_j: the chain's parts outside the span of stage j's tasks (before its forward, after
    # its backward): j transfers and j - 1 forwards before, j transfers and j - 1 backwards after.
    outside = [
        hops.data_to_relay_s
        + hops.relay_to_data_s
        + 2 * (j - 1) * hops.relay_to_relay_s
        + (j - 1) * relay_stage_s
        for j in range(1, stages + 1)
    ]
    work_s = batch * stage_s  # one stage's work, in seconds at speed 1
    nested = max(h + (stages - j) * work_s / speed for j, h in enumerate(outside))
    if not stage_fixed:
        return nested
    return max(nested, _stage_split_s(outside, work_s, speed))


def _stage_split_s(outside: Sequence[float], work_s: float, speed: float) -> float:
    """The least λ with Σ_j work / (λ - h_j) ≤ speed: over every split σ of the relays' speed
    among stages, max_j (h_j + work/σ_j) is at least that. Bisection; returns the low end."""
    low = max(outside)
    high = low + len(outside) * work_s / speed  # each term ≤ speed / S there
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2.0
        if sum(work_s / (middle - h) for h in outside) > speed:
            low = middle
        else:
            high = middle
    return low


def _uplink_s(
    scenario: Scenario, batch: int, data: Sequence[NodeEntry], relays: Sequence[NodeEntry]
) -> float:
    """Transfers spread over the uplinks that cannot be reset by a second life."""
    back = _may_come_back(scenario)
    relay_regions = _regions(scenario, relays)
    every_region = relay_regions | _regions(scenario, data)
    data_rate = sum(_transfers_per_s(scenario, e, relay_regions) for e in data)
    relay_rate = sum(_transfers_per_s(scenario, e, every_region) for e in relays)
    bound = 0.0
    if not back & {e.id for e in data}:
        bound = 2 * batch / data_rate
    if not back:
        bound = max(bound, (2 * scenario.model.stages + 2) * batch / (data_rate + relay_rate))
    return bound


def _transfers_per_s(scenario: Scenario, node: NodeEntry, targets: Iterable[int]) -> float:
    """Activations a node's uplink can send per second at its best bandwidth to a target."""
    source = scenario.topology.regions.index(node.region)
    best_gbps = max(scenario.topology.bandwidth_gbps[source][t] for t in targets)
    return best_gbps * _BITS_PER_GBIT / (scenario.model.activation_bytes * BITS_PER_BYTE)


# ---- averaging ----


def _data_allreduce_s(
    scenario: Scenario, counted: Sequence[NodeEntry], data: Sequence[NodeEntry]
) -> float:
    topology = scenario.topology
    param_bytes = scenario.model.stage_param_bytes
    if len(counted) == len(data):  # the live data nodes at every barrier: exactly these
        regions = Counter(topology.regions.index(e.region) for e in data)
        return butterfly_allreduce_s(
            regions, param_bytes, topology.latency_ms, topology.bandwidth_gbps
        )
    if len(counted) < 2:
        return 0.0
    members = [topology.regions.index(e.region) for e in counted]
    peers = _regions(scenario, data)
    latency_ms = max(
        topology.latency_ms[a][b]
        for i, a in enumerate(members)
        for j, b in enumerate(members)
        if i != j
    )
    slowest_best_gbps = min(max(topology.bandwidth_gbps[a][b] for b in peers) for a in members)
    share = (len(counted) - 1) / len(counted)
    upload_s = share * param_bytes * BITS_PER_BYTE / (slowest_best_gbps * _BITS_PER_GBIT)
    return 2.0 * (upload_s + latency_ms / 1000.0)


def _relay_allreduce_s(scenario: Scenario, always_up: Sequence[NodeEntry]) -> float:
    """The pigeonhole term for relays up at every barrier (see ``_pigeonhole_allreduce_s``)."""
    return _pigeonhole_allreduce_s(scenario, len(always_up))


def _pigeonhole_allreduce_s(scenario: Scenario, alive: int) -> float:
    """With ``alive`` placed relays some stage holds ⌈alive/S⌉ replicas; a butterfly among n
    takes at least 2·((n-1)/n · P / best bandwidth + least latency) between relays' regions."""
    replicas = math.ceil(alive / scenario.model.stages)
    if replicas < 2:
        return 0.0
    topology = scenario.topology
    regions = _regions(scenario, [e for e in scenario.nodes if e.role == "relay"])
    best_gbps = max(topology.bandwidth_gbps[a][b] for a in regions for b in regions)
    least_ms = min(topology.latency_ms[a][b] for a in regions for b in regions)
    share = (replicas - 1) / replicas
    upload_s = (
        share * scenario.model.stage_param_bytes * BITS_PER_BYTE / (best_gbps * _BITS_PER_GBIT)
    )
    return 2.0 * (upload_s + least_ms / 1000.0)


def _regions(scenario: Scenario, nodes: Iterable[NodeEntry]) -> set[int]:
    index = {r: i for i, r in enumerate(scenario.topology.regions)}
    return {index[e.region] for e in nodes}
