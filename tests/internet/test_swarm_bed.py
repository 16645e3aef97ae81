"""A swarm across the test bed: its data node public, every relay at home behind a cone or a
symmetric NAT (so the two stages' relays cannot dial each other at all), each left on
``p2p.reachable = auto``. Each relay finds out by itself that nobody can dial it, runs
outbound-only through the data node's relay, reaches the other stage through circuits, and
the swarm trains to the losses of the whole model (which the same swarm matches on loopback,
``tests/runtime/test_live_swarm.py``), even though one home relay's link is cut for 3 s
mid-run: it answers the data node again within 5 s of the link's return."""

from __future__ import annotations

import queue
import re
import secrets
import sys
import time
from collections.abc import Callable

import pytest

from gwtf.node.p2p.identity import identity_from_key, peer_id_of
from tests.internet.test_testbed import Lines
from tests.internet.testbed import Bed
from tests.runtime.swarm_harness import reference_losses

PEER = [sys.executable, "-m", "tests.internet.swarm_peer"]
ITERATIONS = 3
#: The home whose link is cut for ``CUT_S`` once the first iteration is done.
CUT = "cone-drop"
CUT_S = 3.0
BATCH = 4
#: Stage -> the homes its relays run in: one cone and one symmetric NAT each.
RELAYS = {1: ("cone-drop", "symmetric-rst"), 2: ("cone-rst", "symmetric-drop")}


def printed(lines: Lines, timeout_s: float, enough: Callable[[list[str]], bool]) -> list[str]:
    """The lines a peer printed, read until ``enough`` of them came or ``timeout_s`` passed."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not enough(seen) and time.monotonic() < deadline:
        try:
            seen.append(lines.lines.get(timeout=max(0.01, deadline - time.monotonic())).strip())
        except queue.Empty:
            break
    assert enough(seen), seen
    return seen


@pytest.mark.slow  # five OS processes loading torch: 80-125 s on two shared cores
def test_a_swarm_with_every_relay_at_home_trains_to_the_reference_losses_across_a_link_cut(
    bed: Bed,
) -> None:
    started = time.monotonic()
    key = secrets.token_bytes(32)
    data_id = peer_id_of(identity_from_key(key))
    data_address = f"/ip4/{bed.hosts['frankfurt'].ip}/tcp/4001/p2p/{data_id}"
    data = Lines(bed.popen("frankfurt", [*PEER, "data", str(ITERATIONS), str(BATCH), key.hex()]))
    assert data.wait_for("address ", 60.0) == f"address {data_address}"
    up = time.monotonic() - started
    relays = {
        home: Lines(bed.popen(home, [*PEER, "relay", str(stage), data_address]))
        for stage, homes in RELAYS.items()
        for home in homes
    }
    reference = reference_losses(ITERATIONS, BATCH)
    losses, at = [], []
    for iteration in range(ITERATIONS):
        losses.append(float(data.wait_for("loss ", 120.0).split()[2]))
        at.append(f"{time.monotonic() - started:.1f}")
        if iteration == 0:  # mid-run: a stage-1 relay's router loses its uplink for a while
            cut_at = time.time()
            bed.cut_link(CUT)
            time.sleep(CUT_S)
            bed.restore_link(CUT)
            restored = time.time()
    assert losses == pytest.approx(reference, rel=1e-4)
    behind_nat = re.compile(
        r"reach False behind NAT: running outbound-only through relay "
        + re.escape(data_address)
        + r"/p2p-circuit \(0 of \d peers dialled it back"
    )
    # Each relay found out by itself that nobody can dial it, and each stage reached the other
    # through circuits (a relay the flow core gave no work may never have needed to).
    relayed = set()

    def since_cut(said: list[str], event: str) -> list[float]:
        times = [float(line.split()[1]) for line in said if line.startswith(f"{event} ")]
        return [t for t in times if t >= cut_at]

    for home, lines in relays.items():

        def enough(seen: list[str], home: str = home) -> bool:
            verdict = any(behind_nat.match(x) for x in seen)
            return verdict and (home != CUT or bool(since_cut(seen, "up")))

        said = printed(lines, 30.0, enough)
        relayed |= {line for line in said if line.startswith("relayed ")}
        if home == CUT:  # the cut was felt, and healed within 5 s of the link's return
            assert since_cut(said, "down"), said
            healed_s = since_cut(said, "up")[0] - restored
            assert healed_s <= 5.0, said
    assert relayed == {"relayed 1", "relayed 2"}, relayed
    checked = time.monotonic() - started
    print(f"data node up at {up:.1f} s, iterations done at {', '.join(at)} s, verdicts read at "
          f"{checked:.1f} s, healed {healed_s:.1f} s after the link's return")  # fmt: skip
