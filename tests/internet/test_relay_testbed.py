"""Two homes behind different routers (one symmetric), which cannot dial each other, talk
through a circuit relay on a public host."""

from __future__ import annotations

import sys

import pytest

from tests.internet.test_testbed import Lines
from tests.internet.testbed import Bed

#: Namespaces, routers and libp2p hosts take seconds a test: CI runs these after the default run.
pytestmark = pytest.mark.slow

PEER = [sys.executable, "-m", "tests.internet.relay_peer"]


def addresses(lines: Lines, timeout_s: float = 30.0) -> list[str]:
    """The ``address`` lines a peer prints, up to the first that is not one."""
    found = [lines.wait_for("address ", timeout_s).split()[1]]
    while True:
        try:
            line = lines.lines.get(timeout=1.0)
        except Exception:  # queue.Empty: it printed them all
            return found
        if not line.startswith("address "):
            return found
        found.append(line.split()[1])


def test_two_homes_behind_nat_exchange_requests_through_a_public_relay(bed: Bed) -> None:
    relay = Lines(bed.popen("frankfurt", [*PEER, "relay"]))
    relay_address = addresses(relay)[0]
    assert relay_address.startswith(f"/ip4/{bed.hosts['frankfurt'].ip}/tcp/4001/p2p/")
    target = Lines(bed.popen("symmetric-rst", [*PEER, "home", relay_address]))
    advertised = addresses(target)
    # Its circuit through the relay first, then its LAN address (of no use from outside).
    assert advertised[0].startswith(f"{relay_address}/p2p-circuit/p2p/"), advertised
    assert f"/ip4/{bed.hosts['symmetric-rst'].ip}/tcp/4001/" in advertised[1]
    dialer = Lines(bed.popen("cone-drop", [*PEER, "dial", relay_address, *advertised]))
    reply = dialer.wait_for("reply ", 60.0).split()
    assert reply[1:3] == ["hello", "relayed=True"], reply


def test_a_dropped_circuit_is_dialled_again_through_the_relay_not_at_the_homes_router(
    bed: Bed,
) -> None:
    relay = Lines(bed.popen("tokyo", [*PEER, "relay"]))
    relay_address = addresses(relay)[0]
    home = bed.hosts["symmetric-drop"]
    # An address of the home's router that forwards nothing: a dial there waits out its deadline.
    unforwarded = f"/ip4/{home.public_ip}/tcp/4001"
    target = Lines(bed.popen(home.name, [*PEER, "home", relay_address, unforwarded]))
    advertised = addresses(target)
    assert advertised[0].startswith(f"{relay_address}/p2p-circuit/p2p/"), advertised
    assert advertised[1].startswith(f"{unforwarded}/p2p/"), advertised
    before = bed.refused_dials(home)
    dialer = Lines(bed.popen("oregon", [*PEER, "redial", relay_address, *advertised]))
    reply = dialer.wait_for("redial ", 60.0).split()
    assert reply[1:] == ["again", "relayed=True", "circuits=2"], reply
    assert bed.refused_dials(home) == before  # the router saw no dial of its own
