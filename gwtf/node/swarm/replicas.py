"""Whether every live replica of each stage ended the run with its stage: same step, same weights.

Replicas of a stage average their gradients and apply the same step, so at the end of every
iteration they hold the same state bit for bit (the state digest of ``gwtf.node.process``'s status).
One that does not (a restarted relay left out of the averaging, a replica that missed a step)
trained on weights its stage does not have, and the swarm's summary names it.

The expected step is the run's (the data node's, which steps once per iteration); the expected
digest is the one most replicas at that step hold. Two replicas that disagree with no majority
between them are both named: nothing says which one is right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any


def replicas_out_of_step(
    relays: Mapping[str, Mapping[str, Any]], run_step: int | None
) -> list[dict[str, Any]]:
    """The live relays (name -> their ``stage``, ``step`` and ``state_digest``) that did not end
    at their stage's step and digest, each with what was expected; sorted by name."""
    by_stage: dict[int, list[str]] = {}
    for name, relay in relays.items():
        by_stage.setdefault(int(relay["stage"]), []).append(name)
    flagged = []
    for stage, names in sorted(by_stage.items()):
        steps = [relays[name]["step"] for name in names if relays[name]["step"] is not None]
        step = run_step if run_step is not None else max(steps, default=None)
        digest = _majority([relays[n]["state_digest"] for n in names if relays[n]["step"] == step])
        for name in names:
            relay = relays[name]
            if relay["step"] != step or digest is None or relay["state_digest"] != digest:
                flagged.append(
                    {
                        "node": name,
                        "stage": stage,
                        "step": relay["step"],
                        "state_digest": relay["state_digest"],
                        "expected_step": step,
                        "expected_digest": digest,
                    }
                )
    return sorted(flagged, key=lambda entry: entry["node"])


def _majority(digests: list[str | None]) -> str | None:
    """The digest more of ``digests`` hold than any other; None without a strict winner."""
    ranked = Counter(d for d in digests if d is not None).most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]
