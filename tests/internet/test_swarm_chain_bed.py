"""``gwtf-node swarm``'s runner with its chain across the test bed: the sponsor's host serves the
devnet and runs the data node, one relay of each stage is at home (a cone NAT that drops
unsolicited dials, a symmetric NAT that resets them: the two neighbouring stages' home relays
cannot dial each other at all), the other two are public. The symmetric-NAT home relay
equivocates: it countersigns a second version of a hop it received, which only its own receipts
hold. The auditor reads every relay's receipts, the home relays' through the data node they
keep connected (``/gwtf/receipts-via``), finds that equivocation and has the relay slashed;
every honest relay, the other at home included, is paid on chain for exactly its certified hops,
and the audit re-executes every certified hop, the home relays' fetched through the data node
too (``/gwtf/evidence-via``): no other finding, no hop left unreplayed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gwtf.node.swarm.exactness import against_whole_model
from tests.internet.testbed import Bed
from tests.runtime.test_swarm_processes import certified_units

ITERATIONS = 6
#: Every certified hop: iterations x 2 microbatches x 2 stages x 2 directions.
HOPS = ITERATIONS * 2 * 2 * 2
#: Relay -> the bed host it runs on; the data node runs beside the chain, at "frankfurt".
RELAYS = {
    "relay-1-0": "cone-drop",
    "relay-1-1": "oregon",
    "relay-2-0": "symmetric-rst",
    "relay-2-1": "tokyo",
}
AT_HOME = ("relay-1-0", "relay-2-0")
#: The home relay that equivocates (``gwtf.node.receipts.cheats``), as a counterparty.
CHEATER = "relay-2-0"
OUTBOUND_ONLY = "reachability: behind NAT: running outbound-only through relay"


def swarm_file(chain_host: str) -> str:
    return f"""
[run]
iterations = {ITERATIONS}
microbatches_per_iteration = 2
seed = 3
[swarm]
relays_per_stage = 2
capacity = 1
cheaters = {{"{CHEATER}" = "equivocate"}}
[chain]
host = "{chain_host}"
audit_sample = {HOPS}
"""


@pytest.mark.slow  # a devnet and five OS processes loading torch: ~2-4 minutes on two cores
def test_relays_at_home_are_audited_as_public_ones_a_home_equivocator_slashed_the_rest_paid(
    bed: Bed, tmp_path: Path
) -> None:
    sponsor = bed.hosts["frankfurt"]
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "swarm.toml").write_text(swarm_file(sponsor.ip))
    placement = {"data": ["", sponsor.region]}
    for name, host in RELAYS.items():
        placement[name] = [bed.hosts[host].namespace, bed.hosts[host].region]
    argv = [sys.executable, "-m", "tests.internet.chain_swarm", str(tmp_path / "swarm.toml")]
    runner = bed.popen(sponsor, [*argv, str(out), json.dumps(placement)])
    try:
        runner.wait(timeout=600)
    finally:
        log = (out / "swarm.log").read_text() if (out / "swarm.log").exists() else ""
    assert runner.returncode == 0, (runner.stderr.read() if runner.stderr else b"")[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == ITERATIONS
    exactness = against_whole_model(out, summary)
    assert exactness["worst_relative_difference"] < 1e-4, exactness
    # The home relays found out by themselves that nobody can dial them.
    for name in AT_HOME:
        said = [line for line in log.splitlines() if f" {name} " in line]
        assert any(OUTBOUND_ONLY in line for line in said), said[-20:]
    chain = summary["chain"]
    (epoch,) = chain["epochs"]
    assert epoch["adds_up"], epoch
    addresses = {node["node"]: node["node_address"] for node in chain["registered_nodes"]}
    certified = certified_units(out, chain["run_id"], 1)
    earnings = chain["earnings"]
    honest = [name for name in RELAYS if name != CHEATER]
    for name in honest:
        assert earnings[name]["units"] == certified.get(addresses[name], 0) > 0, name
        claims = earnings[name]["claims"]
        assert claims and all(c["status"] == "confirmed" for c in claims), (name, claims)
    assert earnings[CHEATER]["units"] == 0 and earnings[CHEATER]["stake_wei"] == "0"
    paid = sum(int(earnings[name]["reward_wei"]) for name in RELAYS)
    assert paid == int(epoch["claimed_wei"]) > 0
    audit = chain["audit"]
    # Every relay's receipts were read: the public ones' directly, the home ones' through the
    # data node, since nobody can dial them.
    assert audit["peers_unread"] == {}, audit["peers_unread"]
    assert audit["peers_forwarded"] == dict.fromkeys(AT_HOME, "data"), audit
    # The one finding: the home relay's second countersignature, seen only in its own receipts.
    (found,) = audit["findings"]
    assert found["kind"] == "equivocation" and found["accused"] == CHEATER, found
    assert "as counterparty" in found["detail"] and found["provable_on_chain"], found
    (slashed,) = [c for c in audit["challenges"] if c["outcome"] == "slashed"]
    assert slashed["accused"] == CHEATER and int(slashed["slashed_wei"]) > 0, slashed
    assert audit["sample_notes"] == []
    assert audit["replayed"] == audit["replayed_exact"] == HOPS, audit
    for name in AT_HOME:
        assert audit["replayed_exact_by_worker"].get(name, 0) > 0, audit
