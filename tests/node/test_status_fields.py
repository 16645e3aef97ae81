"""What ``gwtf-node status`` shows of a running node's ``/v1/status``: its reachability line
among the rest, once the node has checked itself."""

from __future__ import annotations

from typing import Any

from gwtf.node.cli.nodes import _live_fields

LIVE: dict[str, Any] = {
    "role": "relay",
    "stage": 1,
    "iteration": 4,
    "epoch": 0,
    "peers_alive": 3,
    "flows_in": 2,
    "flows_out": 2,
    "hops_computed": 40,
    "throughput_hops_per_s": 1.5,
    "health": {"status": "ok", "detail": ""},
}


def test_status_shows_the_reachability_line_once_there_is_one() -> None:
    assert "reachability" not in _live_fields({**LIVE, "reachability": ""})
    line = "behind NAT: running outbound-only through relay /ip4/198.18.2.2/tcp/4001/p2p/x"
    assert _live_fields({**LIVE, "reachability": line})["reachability"] == line
