"""Application-level link emulation: one machine behaves like a swarm spread over regions.

Kernel traffic shaping is not available on the machines GWTF is developed and tested on, so the
transfer protocols ask this model when a message of ``n`` bytes sent now would arrive, and wait
that long before handing it to the stream. Each directed pair of nodes is a link with its own
serialisation queue (bytes / bandwidth, one message after another) followed by the one-way latency
of the two nodes' regions. Pure and deterministic: ``now`` is an input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gwtf.errors import ConfigError

_BITS_PER_BYTE = 8
_BITS_PER_GBIT = 1e9


@dataclass(frozen=True)
class Topology:
    """One-way latency (ms) and bandwidth (Gbit/s) between named regions."""

    regions: tuple[str, ...]
    latency_ms: tuple[tuple[float, ...], ...]
    bandwidth_gbps: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.regions)
        for name, matrix in (
            ("latency_ms", self.latency_ms),
            ("bandwidth_gbps", self.bandwidth_gbps),
        ):
            if len(matrix) != n or any(len(row) != n for row in matrix):
                raise ConfigError(f"topology {name} must be a {n}x{n} matrix, one row per region")
        if any(b <= 0 for row in self.bandwidth_gbps for b in row):
            raise ConfigError("topology bandwidth_gbps must be positive everywhere")
        if any(lat < 0 for row in self.latency_ms for lat in row):
            raise ConfigError("topology latency_ms must not be negative")

    @classmethod
    def from_json_file(cls, path: Path) -> Topology:
        try:
            raw = json.loads(path.read_text())
            return cls(
                regions=tuple(raw["regions"]),
                latency_ms=tuple(tuple(float(v) for v in row) for row in raw["latency_ms"]),
                bandwidth_gbps=tuple(tuple(float(v) for v in row) for row in raw["bandwidth_gbps"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"cannot read topology file {path}: {exc}; give a JSON file with regions, "
                "latency_ms and bandwidth_gbps"
            ) from exc

    def index(self, region: str) -> int:
        try:
            return self.regions.index(region)
        except ValueError:
            raise ConfigError(
                f"unknown region {region!r}; choose one of {', '.join(self.regions)}"
            ) from None

    def latency_s(self, src_region: str, dst_region: str) -> float:
        return self.latency_ms[self.index(src_region)][self.index(dst_region)] / 1000.0

    def bytes_per_s(self, src_region: str, dst_region: str) -> float:
        gbps = self.bandwidth_gbps[self.index(src_region)][self.index(dst_region)]
        return gbps * _BITS_PER_GBIT / _BITS_PER_BYTE


@dataclass
class LinkEmulator:
    """Arrival times of messages on emulated links between regions."""

    topology: Topology
    _busy_until: dict[tuple[str, str], float] = field(default_factory=dict)

    def arrival_time(
        self, src: str, dst: str, src_region: str, dst_region: str, n_bytes: int, now: float
    ) -> float:
        """When ``n_bytes`` sent from ``src`` to ``dst`` at ``now`` have fully arrived.

        Messages on one directed link are serialised one after another (a link carries one
        message's bytes at a time); latency is added after the last byte leaves.
        """
        link = (src, dst)
        start = max(now, self._busy_until.get(link, now))
        done_sending = start + n_bytes / self.topology.bytes_per_s(src_region, dst_region)
        self._busy_until[link] = done_sending
        return done_sending + self.topology.latency_s(src_region, dst_region)

    def forget(self, peer: str) -> None:
        """Drop the queues of links touching ``peer`` (it left or crashed)."""
        for link in [link for link in self._busy_until if peer in link]:
            del self._busy_until[link]
