"""The cost model of one edge of a flow, and the smoothing of measured link delays.

The cost of sending one microbatch across the edge between consecutive-stage nodes i and j,
forward and backward together, is the GWTF paper's (Blagoev et al., arXiv 2509.21221):

    d_ij = (c_i + c_j)/2 + (λ_ij + λ_ji)/2 + 2·size/(β_ij + β_ji)

with c a node's compute time for its stage, λ one-way latency, β bandwidth and ``size`` the bytes
of activations that cross the edge. Half of each endpoint's compute is charged to each of its two
edges, so the cost of a path is the sum of its edge costs. Every value here is in milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gwtf.coordinator_free.flow_errors import CostModelError

#: Weight of the previous estimate in the per-neighbour delay smoothing (authors' prototype).
DELAY_SMOOTHING_OLD = 0.6
#: Weight of the new measurement in the per-neighbour delay smoothing (authors' prototype).
DELAY_SMOOTHING_NEW = 0.4

_BITS_PER_BYTE = 8.0
_BITS_PER_GBIT = 1e9
_MS_PER_S = 1000.0


def transfer_time_ms(size_bytes: float, bandwidth_gbps: float) -> float:
    """Milliseconds to push ``size_bytes`` through a link of ``bandwidth_gbps``."""
    _require_non_negative("size_bytes", size_bytes)
    _require_positive("bandwidth_gbps", bandwidth_gbps)
    return size_bytes * _BITS_PER_BYTE / (bandwidth_gbps * _BITS_PER_GBIT) * _MS_PER_S


@dataclass(frozen=True, slots=True)
class EdgeInputs:
    """What one edge costs depends on: both nodes' compute and both directions of the link."""

    compute_i_ms: float
    compute_j_ms: float
    latency_ij_ms: float
    latency_ji_ms: float
    bandwidth_ij_gbps: float
    bandwidth_ji_gbps: float
    activation_bytes: float


def edge_cost_ms(edge: EdgeInputs) -> float:
    """The paper's d_ij in milliseconds: compute halves + mean latency + the 2·size transfer."""
    for name in ("compute_i_ms", "compute_j_ms", "latency_ij_ms", "latency_ji_ms"):
        _require_non_negative(name, getattr(edge, name))
    _require_positive("bandwidth_ij_gbps", edge.bandwidth_ij_gbps)
    _require_positive("bandwidth_ji_gbps", edge.bandwidth_ji_gbps)
    compute = (edge.compute_i_ms + edge.compute_j_ms) / 2.0
    latency = (edge.latency_ij_ms + edge.latency_ji_ms) / 2.0
    # 2·size/(β_ij+β_ji): the transfer of `size` bytes at the mean of the two directions' bandwidth.
    transfer = transfer_time_ms(
        2.0 * edge.activation_bytes, edge.bandwidth_ij_gbps + edge.bandwidth_ji_gbps
    )
    return compute + latency + transfer


def symmetric_edge_cost_ms(
    compute_i_ms: float,
    compute_j_ms: float,
    latency_ms: float,
    bandwidth_gbps: float,
    activation_bytes: float,
) -> float:
    """d_ij when one estimate serves both directions of the link (what a node measures alone)."""
    return edge_cost_ms(
        EdgeInputs(
            compute_i_ms=compute_i_ms,
            compute_j_ms=compute_j_ms,
            latency_ij_ms=latency_ms,
            latency_ji_ms=latency_ms,
            bandwidth_ij_gbps=bandwidth_gbps,
            bandwidth_ji_gbps=bandwidth_gbps,
            activation_bytes=activation_bytes,
        )
    )


def relayed_latency_ms(latency_ms: float, relay_leg_ms: float) -> float:
    """The one-way latency routing charges an edge that runs through a circuit relay: the
    edge's own estimate plus the relay's extra leg (``relay_leg_ms``: this node's estimate of
    its link to the relay). Where the edge was measured over the circuit the leg is counted
    twice, which only strengthens the preference for direct edges; on an emulated bed, whose
    latency follows the two ends' regions and not the path, the leg is the whole detour."""
    _require_non_negative("latency_ms", latency_ms)
    _require_non_negative("relay_leg_ms", relay_leg_ms)
    return latency_ms + relay_leg_ms


def smooth_delay(previous: float | None, measured: float) -> float:
    """The per-neighbour estimate ``0.6·old + 0.4·measured``; a first measurement is taken as is."""
    _require_non_negative("measured", measured)
    if previous is None:
        return measured
    return DELAY_SMOOTHING_OLD * previous + DELAY_SMOOTHING_NEW * measured


def path_cost_ms(edge_costs_ms: list[float]) -> float:
    """The cost of a flow: the sum of the costs of its edges."""
    return math.fsum(edge_costs_ms)


def _require_non_negative(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise CostModelError(f"{name} must be a finite number >= 0, got {value!r}; fix the input")


def _require_positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise CostModelError(f"{name} must be a finite number > 0, got {value!r}; fix the input")
