"""The edge cost d_ij and the delay smoothing, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest

from gwtf.coordinator_free.cost import (
    EdgeInputs,
    edge_cost_ms,
    path_cost_ms,
    relayed_latency_ms,
    smooth_delay,
    symmetric_edge_cost_ms,
    transfer_time_ms,
)
from gwtf.coordinator_free.flow_errors import CostModelError
from gwtf.errors import ConfigError


def test_transfer_time_of_one_megabyte_at_one_gigabit() -> None:
    # 1e6 bytes = 8e6 bits at 1e9 bit/s = 8 ms
    assert transfer_time_ms(1e6, 1.0) == pytest.approx(8.0)


def test_edge_cost_matches_the_papers_formula_by_hand() -> None:
    edge = EdgeInputs(
        compute_i_ms=100.0,
        compute_j_ms=60.0,
        latency_ij_ms=20.0,
        latency_ji_ms=30.0,
        bandwidth_ij_gbps=1.0,
        bandwidth_ji_gbps=3.0,
        activation_bytes=4e6,
    )
    # (100+60)/2 + (20+30)/2 + 2*4e6*8 bits / (4e9 bit/s) = 80 + 25 + 16 ms
    assert edge_cost_ms(edge) == pytest.approx(121.0)


def test_symmetric_cost_is_the_general_cost_with_equal_directions() -> None:
    general = edge_cost_ms(EdgeInputs(10.0, 30.0, 5.0, 5.0, 2.0, 2.0, 1e6))
    assert symmetric_edge_cost_ms(10.0, 30.0, 5.0, 2.0, 1e6) == pytest.approx(general)


def test_cost_grows_with_latency_and_size_and_falls_with_bandwidth() -> None:
    base = symmetric_edge_cost_ms(10.0, 10.0, 10.0, 1.0, 1e6)
    assert symmetric_edge_cost_ms(10.0, 10.0, 20.0, 1.0, 1e6) > base
    assert symmetric_edge_cost_ms(10.0, 10.0, 10.0, 1.0, 2e6) > base
    assert symmetric_edge_cost_ms(10.0, 10.0, 10.0, 2.0, 1e6) < base


def test_smoothing_takes_the_first_measurement_then_weighs_old_point_six() -> None:
    first = smooth_delay(None, 100.0)
    assert first == 100.0
    assert smooth_delay(first, 50.0) == pytest.approx(0.6 * 100.0 + 0.4 * 50.0)


def test_a_relayed_edge_adds_the_relays_leg_to_its_latency() -> None:
    assert relayed_latency_ms(40.0, 25.0) == 65.0
    with pytest.raises(CostModelError, match="relay_leg_ms"):
        relayed_latency_ms(40.0, -1.0)


def test_path_cost_is_the_sum_of_edges() -> None:
    assert path_cost_ms([1.5, 2.5, 3.0]) == pytest.approx(7.0)


@pytest.mark.parametrize(
    "bad",
    [
        dict(compute_i_ms=-1.0),
        dict(latency_ij_ms=math.nan),
        dict(bandwidth_ij_gbps=0.0),
        dict(bandwidth_ji_gbps=math.inf),
    ],
)
def test_bad_inputs_raise_a_typed_config_error(bad: dict[str, float]) -> None:
    values = dict(
        compute_i_ms=1.0,
        compute_j_ms=1.0,
        latency_ij_ms=1.0,
        latency_ji_ms=1.0,
        bandwidth_ij_gbps=1.0,
        bandwidth_ji_gbps=1.0,
        activation_bytes=1.0,
    )
    values.update(bad)
    with pytest.raises(CostModelError) as err:
        edge_cost_ms(EdgeInputs(**values))
    assert isinstance(err.value, ConfigError)
    assert "\n" not in str(err.value)
