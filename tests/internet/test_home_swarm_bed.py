"""Both stages at home: ``gwtf-node swarm``'s runner (no chain) on the test bed with its data
node public and all four relays behind home routers (a cone and a symmetric NAT per stage, one
router dropping unsolicited dials and one resetting them), every node left on
``p2p.reachable = auto`` with the regions' latency emulated, as ``bench/internet.py``'s 4/4 row
runs it, and the same with every home behind a cone NAT that drops unsolicited dials (its
"4/4 (cone NATs)" rows). Every link between the stages starts as a circuit through the data
node's relay; behind the cone NATs each is punched to a direct connection, and no punch with a
symmetric home succeeds. The swarm trains every iteration to the losses of the whole
model trained alone on the same microbatches, with no gradient lost or counted twice, and every
relay doing hops."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from gwtf.node.status_file import read_results
from gwtf.node.swarm.plan import NodeHost, plan_from_file
from gwtf.node.swarm.run import read_status, run_swarm
from gwtf.node.training.reference import whole_model_run
from gwtf.node.training.settings import TrainingSettings
from tests.internet.conftest import require_testbed
from tests.internet.testbed import HomeSpec, build_bed

REGIONS_FILE = (
    Path(__file__).resolve().parents[2] / "gwtf/coordinator_free/sim/data/regions-10.json"
)
ITERATIONS = 8
STAGE_REGIONS = {1: "oregon", 2: "tokyo"}
MIXED = (
    HomeSpec("relay-1-0", "oregon", nat="cone", inbound="drop"),
    HomeSpec("relay-1-1", "oregon", nat="symmetric", inbound="rst"),
    HomeSpec("relay-2-0", "tokyo", nat="cone", inbound="rst"),
    HomeSpec("relay-2-1", "tokyo", nat="symmetric", inbound="drop"),
)
#: Every home behind a cone NAT that drops unsolicited dials: every pair can punch.
CONES = tuple(HomeSpec(h.name, h.region, nat="cone", inbound="drop") for h in MIXED)
SWARM = f"""
[run]
iterations = {ITERATIONS}
microbatches_per_iteration = 4
[swarm]
relays_per_stage = 2
capacity = 2
topology = "{REGIONS_FILE}"
regions = ["frankfurt"]
[chain]
enabled = false
"""


def reference_losses(node_settings: Path) -> list[float]:
    """The whole model trained alone with the data node's own training settings."""
    training = tomllib.loads(node_settings.read_text())["training"]
    names = {f.name for f in dataclasses.fields(TrainingSettings)}
    settings = TrainingSettings(**{k: v for k, v in training.items() if k in names})
    return whole_model_run(settings, ITERATIONS).losses


@pytest.mark.slow  # five OS processes loading torch on the bed: 2-6 min on two shared cores
@pytest.mark.parametrize("homes", [MIXED, CONES], ids=["mixed-nats", "cone-nats"])
def test_a_swarm_with_both_stages_at_home_trains_every_iteration_to_the_reference_losses(
    tmp_path: Path, homes: tuple[HomeSpec, ...]
) -> None:
    require_testbed()
    (tmp_path / "swarm.toml").write_text(SWARM)
    with build_bed({"data": "frankfurt"}, homes) as bed, open(tmp_path / "swarm.log", "wb") as log:
        plan = plan_from_file(tmp_path / "swarm.toml", tmp_path)
        for name, host in bed.hosts.items():
            region = "frankfurt" if name == "data" else STAGE_REGIONS[int(name.split("-")[1])]
            prefix = ("ip", "netns", "exec", host.namespace)
            plan.hosts[name] = NodeHost(prefix, ("/ip4/0.0.0.0/tcp/4001",), region)
        run_swarm(plan, log, timeout_s=420.0)
        statuses = {name: read_status(proc) or {} for name, proc in plan.procs.items()}
    results = read_results(plan.procs["data"].status_file)
    assert [r["iteration"] for r in results] == list(range(ITERATIONS))
    reference = reference_losses(tmp_path / "data.toml")
    assert [r["loss"] for r in results] == pytest.approx(reference, rel=1e-5, abs=1e-6)
    assert sum(r["gradients_lost"] for r in results) == 0
    duplicated = [(s.get("stats") or {}).get("gradients_duplicated", 0) for s in statuses.values()]
    assert sum(int(d) for d in duplicated) == 0
    hops = {name: int(statuses[name].get("hops_recorded") or 0) for name in statuses}
    assert all(hops[h.name] > 0 for h in homes), hops
    ids = {name: statuses[name].get("peer_id") for name in statuses}
    punched = {name: set(statuses[name].get("punched_peers") or ()) for name in statuses}
    if homes == CONES:
        # Every link between the stages was punched to a direct connection. (Not whether it is
        # still direct when the status is read: a node's last status is written as the swarm
        # stops and its peers leave. Nor that no punch failed: one that times out on two loaded
        # cores is tried again after its backoff.)
        for one, other in [(f"relay-1-{a}", f"relay-2-{b}") for a in (0, 1) for b in (0, 1)]:
            assert ids[other] in punched[one] or ids[one] in punched[other], punched
    else:
        # Every punch to or from a symmetric home failed; those links stayed on the relay.
        # (The cone pair punches when the resetting router's home sends first: not asserted.)
        symmetric = {ids["relay-1-1"], ids["relay-2-1"]}
        assert not symmetric & {p for peers in punched.values() for p in peers}, punched
        assert sum(int(s.get("punch_failures") or 0) for s in statuses.values()) > 0
