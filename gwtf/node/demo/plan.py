"""The swarm `gwtf-node demo` runs, written as a swarm file (``gwtf.node.swarm.plan``'s format) that
`gwtf-node swarm --swarm-file` runs again.

Relays in three regions of the ten-region link emulation, at mixed emulated GPU speeds; relays
SIGKILLed in the middle of a forward and of a backward hop, a killed relay started again, and
joiners that take the bottleneck stage; a relay that signs two versions of a hop (on unless
``cheater`` is off), which the audit proves and the chain slashes; several epochs certified,
audited and claimed. ``quick`` is the same story, smaller: what the test suite runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gwtf import coordinator_free

TOPOLOGY = Path(coordinator_free.__file__).parent / "sim" / "data" / "regions-10.json"
#: The dishonest relay: stage 2's last, so that every stage keeps honest replicas to export.
CHEATER = "relay-2-2"
CHEAT = "claim-twice"


def demo_swarm(quick: bool, family: str, cheater: bool) -> dict[str, dict[str, Any]]:
    """The demo's swarm file. ``family``: "gpt" or "llama" (their tiny sizes)."""
    run = {
        "model": f"{family}-tiny",
        "stages": 2,
        "seq_len": 32,
        "microbatches_per_iteration": 4,
        "iterations": 16 if quick else 40,
        "seed": 7,
    }
    swarm: dict[str, Any] = {
        "relays_per_stage": 3,
        "capacity": 2,
        "regions": ["oregon", "frankfurt", "tokyo"],
        "topology": str(TOPOLOGY),
        # The third relay of each stage is a slow GPU: the flows go round it when they can.
        "speeds": [1.0, 0.8, 0.5],
        # A hop's compute lasts at least this long (then 1 / speed of it): a GPU cluster's
        # timing, not the shared CPUs', so churn lands in the middle of training.
        "hop_ms": 60.0 if quick else 120.0,
    }
    if cheater:
        swarm["cheaters"] = {CHEATER: CHEAT}
    crash_on = [{"stage": 1, "direction": "forward", "iteration": 2}]
    events: list[dict[str, Any]] = [{"t": 3.0, "join": "auto"}]
    if not quick:
        crash_on.append({"stage": 2, "direction": "backward", "iteration": 6})
        events += [
            {"t": 10.0, "kill": "relay-1-1"},
            {"t": 16.0, "restart": "relay-1-1"},
            {"t": 20.0, "join": "auto"},
        ]
    return {
        "run": run,
        "swarm": swarm,
        "chain": {
            "enabled": True,
            "epochs": 2 if quick else 3,
            "audit_sample": 8 if quick else 16,
            "stake_eth": 2.0,
            "fund_eth": 3.0,
            "reward_pool_eth": 10.0,
        },
        "churn": {"crash_on": crash_on, "events": events},
    }
