"""Dialing across the test bed: a router that drops SYNs costs one address's deadline, not the
kernel's two minutes, and a home whose link is cut dials its neighbour again as soon as the
link is back (no 60 s wait in py-libp2p's failed-dial cache)."""

from __future__ import annotations

import sys
import time

import pytest

from tests.internet.test_testbed import Lines
from tests.internet.testbed import Bed

#: Namespaces, routers and libp2p hosts take seconds a test: CI runs these after the default run.
pytestmark = pytest.mark.slow

PEER = [sys.executable, "-m", "tests.internet.reach_peer"]
CUT_S = 3.0


def start_public(bed: Bed, host: str) -> tuple[Lines, str]:
    public = Lines(bed.popen(host, [*PEER, "public"]))
    address = public.wait_for("address ").split()[1]
    return public, address


def test_a_dial_to_a_syn_dropping_router_gives_up_in_time_and_the_next_address_answers(
    bed: Bed,
) -> None:
    _, address = start_public(bed, "tokyo")
    peer_id = address.split("/p2p/")[1]
    dropping = bed.hosts["cone-drop"].public_ip
    silent = f"/ip4/{dropping}/tcp/4001/p2p/{peer_id}"
    done = bed.run("oregon", [*PEER, "dial", "1.0", silent, address], timeout_s=20)
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[:2] == ["reached", f"/ip4/{bed.hosts['tokyo'].ip}/tcp/4001"], done.stdout
    assert 1.0 <= float(words[-1]) < 2.5, done.stdout
    # Alone, the silent address fails within its deadline (TCP alone would wait ~127 s).
    done = bed.run("oregon", [*PEER, "dial", "1.0", silent], timeout_s=20)
    words = done.stdout.split()
    assert words[:2] == ["failed", "after"] and float(words[-1]) < 2.0, done.stdout


@pytest.mark.parametrize("reset", [False, True], ids=["silent", "reset"])
def test_a_home_cut_off_for_3_s_is_back_with_its_neighbour_within_5_s(
    bed: Bed, reset: bool
) -> None:
    """The home's router loses its link for 3 s, and its mappings as it comes back. A silent
    cut leaves the home's connection to heal where TCP can; one that resets the connection
    makes the home dial its neighbour again (its dials meanwhile fail), at once on return."""
    _, address = start_public(bed, "frankfurt")
    home = Lines(bed.popen("symmetric-drop", [*PEER, "home", address]))
    home.wait_for("up ")
    bed.cut_link("symmetric-drop", reset=reset)
    try:
        time.sleep(CUT_S)
        bed.reboot_router("symmetric-drop")
    finally:
        bed.restore_link("symmetric-drop")
    back = time.time()
    assert home.wait_for("down ", timeout_s=5.0)
    wanted = {"up", "reconnected"} if reset else {"up"}
    seen: dict[str, float] = {}
    while not wanted <= set(seen):
        word, at = home.wait_for("", timeout_s=10.0).split()
        seen.setdefault(word, float(at) - back)
    assert all(seen[word] < 5.0 for word in wanted), seen
