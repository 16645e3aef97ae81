"""The algorithms ``gwtf-sim`` can run, by name, built lazily (each imports only what it needs)."""

from __future__ import annotations

import importlib

from coordinator_free.sim.policy import RoutingPolicy
from gwtf.errors import ConfigError, NotBuiltError

ALGORITHMS = ("gwtf", "swarm", "dtfm", "optimal", "round_robin")


def make_policy(name: str) -> RoutingPolicy:
    """A fresh policy for one run (policies keep per-run state)."""
    if name == "swarm":
        from coordinator_free.baselines.swarm import SwarmPolicy

        return SwarmPolicy()
    if name == "dtfm":
        from coordinator_free.baselines.dtfm import DtfmPolicy

        return DtfmPolicy()
    if name == "optimal":
        from coordinator_free.baselines.optimal import OptimalPolicy

        return OptimalPolicy()
    if name == "round_robin":
        from coordinator_free.sim.round_robin import RoundRobinPolicy

        return RoundRobinPolicy()
    if name == "gwtf":
        return _gwtf_policy()
    raise ConfigError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")


def gwtf_available() -> bool:
    try:
        _gwtf_policy()
    except NotBuiltError:
        return False
    return True


def _gwtf_policy() -> RoutingPolicy:
    try:
        module = importlib.import_module("coordinator_free.sim.gwtf_policy")
    except ModuleNotFoundError as exc:
        if exc.name != "coordinator_free.sim.gwtf_policy":
            raise
        raise NotBuiltError(
            "the GWTF simulator policy (coordinator_free/sim/gwtf_policy.py) is not built yet "
            "(issue 3); run another --algorithm"
        ) from exc
    policy_class = getattr(module, "GwtfPolicy", None)
    if policy_class is None:
        raise NotBuiltError("coordinator_free.sim.gwtf_policy has no GwtfPolicy class (issue 3)")
    policy: RoutingPolicy = policy_class()
    return policy
