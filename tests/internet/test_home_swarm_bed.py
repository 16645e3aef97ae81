"""Both stages at home: ``gwtf-node swarm``'s runner (no chain) on the test bed with its data
node public and all four relays behind home routers (a cone and a symmetric NAT per stage, one
router dropping unsolicited dials and one resetting them), every node left on
``p2p.reachable = auto`` with the regions' latency emulated, as ``bench/internet.py``'s 4/4 row
runs it. Every link between the stages is a circuit through the data node's relay; the swarm
trains every iteration to the losses of the whole model trained alone on the same
microbatches, with no gradient lost or counted twice, and every relay doing hops."""

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
HOMES = (
    HomeSpec("relay-1-0", "oregon", nat="cone", inbound="drop"),
    HomeSpec("relay-1-1", "oregon", nat="symmetric", inbound="rst"),
    HomeSpec("relay-2-0", "tokyo", nat="cone", inbound="rst"),
    HomeSpec("relay-2-1", "tokyo", nat="symmetric", inbound="drop"),
)
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
def test_a_swarm_with_both_stages_at_home_trains_every_iteration_to_the_reference_losses(
    tmp_path: Path,
) -> None:
    require_testbed()
    (tmp_path / "swarm.toml").write_text(SWARM)
    with build_bed({"data": "frankfurt"}, HOMES) as bed, open(tmp_path / "swarm.log", "wb") as log:
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
    assert all(hops[h.name] > 0 for h in HOMES), hops
    # The two cone homes of different stages punched a direct connection and keep it; every
    # punch to or from a symmetric home failed, and those links stayed on the relay.
    ids = {name: statuses[name].get("peer_id") for name in statuses}
    punched = {name: statuses[name].get("punched_peers") for name in statuses}
    assert ids["relay-2-0"] in punched["relay-1-0"] or ids["relay-1-0"] in punched["relay-2-0"], (
        punched
    )
    symmetric = {ids["relay-1-1"], ids["relay-2-1"]}
    assert not symmetric & {p for peers in punched.values() for p in peers or ()}, punched
    assert sum(int(s.get("punch_failures") or 0) for s in statuses.values()) > 0
