"""The link model: serialisation then latency, per directed link, from the 10-region matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwtf.errors import ConfigError
from gwtf.node.p2p.link_emulation import LinkEmulator, Topology

TWO_REGIONS = Topology(
    regions=("oregon", "tokyo"),
    latency_ms=((5.0, 96.0), (96.0, 5.0)),
    bandwidth_gbps=((8.0, 0.8), (0.8, 8.0)),
)


def test_one_message_costs_bytes_over_bandwidth_plus_latency() -> None:
    links = LinkEmulator(TWO_REGIONS)
    # 100 MB at 0.8 Gbit/s = 1.0 s, then 96 ms of latency.
    arrival = links.arrival_time("a", "b", "oregon", "tokyo", 100_000_000, now=10.0)
    assert arrival == pytest.approx(11.096)


def test_messages_on_one_link_queue_behind_each_other_but_other_links_do_not() -> None:
    links = LinkEmulator(TWO_REGIONS)
    first = links.arrival_time("a", "b", "oregon", "tokyo", 100_000_000, now=0.0)
    second = links.arrival_time("a", "b", "oregon", "tokyo", 100_000_000, now=0.0)
    reverse = links.arrival_time("b", "a", "tokyo", "oregon", 100_000_000, now=0.0)
    assert second - first == pytest.approx(1.0)
    assert reverse == pytest.approx(first)


def test_forgetting_a_peer_clears_its_queues() -> None:
    links = LinkEmulator(TWO_REGIONS)
    links.arrival_time("a", "b", "oregon", "tokyo", 100_000_000, now=0.0)
    links.forget("b")
    assert links.arrival_time("a", "b", "oregon", "tokyo", 0, now=0.0) == pytest.approx(0.096)


def test_the_shipped_ten_region_matrix_loads() -> None:
    shipped = Path(__file__).resolve().parents[2] / "gwtf/coordinator_free/sim/data/regions-10.json"
    topology = Topology.from_json_file(shipped)
    assert len(topology.regions) == 10
    assert topology.latency_s("oregon", "oregon") < topology.latency_s("oregon", "sydney")


def test_bad_topologies_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="2x2 matrix"):
        Topology(regions=("a", "b"), latency_ms=((1.0,),), bandwidth_gbps=((1.0, 1.0), (1.0, 1.0)))
    with pytest.raises(ConfigError, match="positive"):
        Topology(regions=("a",), latency_ms=((1.0,),), bandwidth_gbps=((0.0,),))
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"regions": ["a"]}))
    with pytest.raises(ConfigError, match="cannot read topology"):
        Topology.from_json_file(bad)
    with pytest.raises(ConfigError, match="unknown region"):
        TWO_REGIONS.latency_s("oregon", "mars")
