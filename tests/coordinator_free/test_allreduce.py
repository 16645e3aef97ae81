"""The engine's gradient averaging: butterfly all-reduce time among a stage's live replicas."""

from __future__ import annotations

import pytest

from gwtf.coordinator_free.sim.iterations import butterfly_allreduce_s

MB = 1_000_000
# Two regions: 10 ms inside each, 100 ms between; 8 Gbit/s inside, 1 Gbit/s between.
LATENCY_MS = [[10.0, 100.0], [100.0, 10.0]]
BANDWIDTH_GBPS = [[8.0, 1.0], [1.0, 8.0]]


def test_one_replica_averages_nothing() -> None:
    assert butterfly_allreduce_s({0: 1}, 50 * MB, LATENCY_MS, BANDWIDTH_GBPS) == 0.0
    assert butterfly_allreduce_s({}, 50 * MB, LATENCY_MS, BANDWIDTH_GBPS) == 0.0


def test_two_replicas_cost_what_a_ring_of_two_costs() -> None:
    # A ring of 2 takes 2(n-1) = 2 steps of P/2 each: the same exchange as the butterfly.
    seconds = butterfly_allreduce_s({0: 2}, 8 * MB, LATENCY_MS, BANDWIDTH_GBPS)
    ring_s = 2 * 1 * (8 * MB * 8 / 2 / 8e9 + 0.010)
    assert seconds == pytest.approx(ring_s)


def test_one_region_pays_two_latencies_and_the_uplink_for_n_minus_1_parts() -> None:
    n = 100
    seconds = butterfly_allreduce_s({0: n}, 50 * MB, LATENCY_MS, BANDWIDTH_GBPS)
    expected = 2 * ((n - 1) * (50 * MB * 8 / n) / 8e9 + 0.010)
    assert seconds == pytest.approx(expected)
    ring_s = 2 * (n - 1) * (50 * MB * 8 / n / 8e9 + 0.010)
    assert seconds < ring_s / 10  # the ring pays 2(n-1) latencies


def test_the_slowest_uplink_and_the_longest_latency_set_the_time() -> None:
    # Region 0 holds 3 replicas, region 1 one: each region-0 replica sends 2 parts at 8 Gbit/s
    # and 1 at 1 Gbit/s; the region-1 replica sends 3 parts at 1 Gbit/s (the slowest).
    part_bits = 40 * MB * 8 / 4
    seconds = butterfly_allreduce_s({0: 3, 1: 1}, 40 * MB, LATENCY_MS, BANDWIDTH_GBPS)
    assert seconds == pytest.approx(2 * (3 * part_bits / 1e9 + 0.100))


def test_a_region_with_no_replica_plays_no_part() -> None:
    alone = butterfly_allreduce_s({0: 4}, 40 * MB, LATENCY_MS, BANDWIDTH_GBPS)
    with_empty = butterfly_allreduce_s({0: 4, 1: 0}, 40 * MB, LATENCY_MS, BANDWIDTH_GBPS)
    assert alone == with_empty
