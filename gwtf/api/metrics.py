"""The node's Prometheus metrics: which there are, and their text exposition.

Each scrape reads one ``NodeServices.metrics()`` snapshot into a registry of its own (no
process-global registry: two nodes in one process, or a test's apps, never share counters).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class MetricSpec:
    name: str  # without the ``gwtf_`` prefix; a counter without ``_total``
    kind: str  # "counter" | "gauge"
    help: str


METRICS = (
    MetricSpec("hops_computed", "counter", "Hops (one stage's forward or backward) computed"),
    MetricSpec("hops_recomputed", "counter", "Hops computed again after a loss or re-route"),
    MetricSpec("hops_sent", "counter", "Hop outputs sent to the next node"),
    MetricSpec("bytes_sent", "counter", "Bytes of hop frames sent"),
    MetricSpec("bytes_received", "counter", "Bytes of hop frames received"),
    MetricSpec("queue_depth", "gauge", "Received hops waiting for compute"),
    MetricSpec("sends_in_flight", "gauge", "Sends waiting for their acknowledgement"),
    MetricSpec("throughput_hops_per_second", "gauge", "Hops computed per second, last minute"),
    MetricSpec("loss", "gauge", "A data node's loss of its last iteration"),
    MetricSpec(
        "validation_loss", "gauge", "A data node's last validation loss of the swarm's model"
    ),
    MetricSpec(
        "validation_verified",
        "gauge",
        "1 when two relays of every stage agreed on the weights of the last validation loss",
    ),
    MetricSpec("iteration", "gauge", "The training iteration"),
    MetricSpec("epoch", "gauge", "The run's epoch by chain time"),
    MetricSpec("peers_alive", "gauge", "Peers the flow protocol hears from"),
    MetricSpec("flows_in", "gauge", "Flows arriving at this node"),
    MetricSpec("flows_out", "gauge", "Flows leaving this node"),
    MetricSpec("receipts_signed", "counter", "Receipts signed as worker"),
    MetricSpec("receipts_countersigned", "counter", "Receipts countersigned as receiver"),
    MetricSpec("receipts_refused", "counter", "Peers' receipt signatures that did not check"),
    MetricSpec("rewards_claimed_eth", "counter", "Rewards claimed by this node, in ETH"),
    MetricSpec("rewards_claimable_eth", "gauge", "Rewards settled and not yet claimed, in ETH"),
)


class _Snapshot(Collector):
    def __init__(self, read: Callable[[], dict[str, float]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        values = self.read()
        for spec in METRICS:
            if spec.name not in values:
                continue
            family = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            yield family(f"gwtf_{spec.name}", spec.help, value=float(values[spec.name]))


def exposition(read: Callable[[], dict[str, float]]) -> bytes:
    """The Prometheus text format of one metrics snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(read))
    return generate_latest(registry)
