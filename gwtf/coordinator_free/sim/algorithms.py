"""The algorithms ``gwtf-sim`` can run, by name, built lazily (each imports only what it needs)."""

from __future__ import annotations

from gwtf.coordinator_free.sim.policy import RoutingPolicy
from gwtf.errors import ConfigError

ALGORITHMS = ("gwtf", "gwtf-oracles", "swarm", "dtfm", "central", "round_robin")


def make_policy(name: str) -> RoutingPolicy:
    """A fresh policy for one run (policies keep per-run state)."""
    if name == "swarm":
        from gwtf.coordinator_free.baselines.swarm import SwarmPolicy

        return SwarmPolicy()
    if name == "dtfm":
        from gwtf.coordinator_free.baselines.dtfm import DtfmPolicy

        return DtfmPolicy()
    if name == "central":
        from gwtf.coordinator_free.baselines.central import CentralPolicy

        return CentralPolicy()
    if name == "round_robin":
        from gwtf.coordinator_free.sim.round_robin import RoundRobinPolicy

        return RoundRobinPolicy()
    if name == "gwtf":
        return _gwtf_policy()
    if name == "gwtf-oracles":
        return _gwtf_policy(oracles=True)
    raise ConfigError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")


def _gwtf_policy(oracles: bool = False) -> RoutingPolicy:
    from gwtf.coordinator_free.sim.gwtf_policy import GwtfPolicy

    return GwtfPolicy(oracles=oracles)
