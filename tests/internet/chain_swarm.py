"""``gwtf-node swarm``'s runner (``gwtf.node.swarm.run``) with its chain, across the test bed: run
in a public host's namespace (the sponsor's), it serves the devnet there, runs the data node there
and every relay in its own namespace, and audits, certifies and pays as on loopback.

    python -m tests.internet.chain_swarm SWARM_FILE OUT PLACEMENT_JSON

``PLACEMENT_JSON``: ``{"node name": [namespace, region], ...}`` for every node; namespace ""
runs it here (the data node, beside the chain). Every node listens on all its interfaces at
port 4001 with ``p2p.reachable = auto``. The swarm's summary is ``OUT/summary.json``; the
process exits 0 once it is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gwtf.node.swarm.plan import NodeHost, SwarmPlan, plan_from_file
from gwtf.node.swarm.run import run_swarm

EVERY_INTERFACE = ("/ip4/0.0.0.0/tcp/4001",)


def place(plan: SwarmPlan, placement: dict[str, list[str]]) -> None:
    for name, (namespace, region) in placement.items():
        prefix = ("ip", "netns", "exec", namespace) if namespace else ()
        plan.hosts[name] = NodeHost(prefix, EVERY_INTERFACE, region)


def main() -> None:
    swarm_file, out, placement = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    plan = plan_from_file(swarm_file, out)
    place(plan, placement)
    with (out / "swarm.log").open("wb") as log:
        run_swarm(plan, log, timeout_s=540.0)


if __name__ == "__main__":
    main()
