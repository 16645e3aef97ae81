"""Reachability across the test bed: three public witnesses dial each node back. A public node
is reachable, a home behind either kind of NAT is not (even one that announces its router's
address without a port forward), and a home whose router forwards its port is reachable at the
router's address."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.internet.test_testbed import Lines
from tests.internet.testbed import Bed

#: Namespaces, routers and libp2p hosts take seconds a test: CI runs these after the default run.
pytestmark = pytest.mark.slow

PEER = [sys.executable, "-m", "tests.internet.reach_peer"]
WITNESSES = ("oregon", "tokyo", "frankfurt")


@pytest.fixture(scope="module")
def witnesses(bed: Bed) -> Iterator[list[str]]:
    addresses = []
    for host in WITNESSES:
        witness = Lines(bed.popen(host, [*PEER, "witness", "4001"]))
        addresses.append(witness.wait_for("address ").split()[1])
    yield addresses


def check(bed: Bed, host: str, witnesses: list[str], announce: str = "-") -> str:
    done = bed.run(host, [*PEER, "check", "4002", announce, *witnesses], timeout_s=40)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_public_node_is_reachable(bed: Bed, witnesses: list[str]) -> None:
    line = check(bed, "oregon", witnesses)
    ip = bed.hosts["oregon"].ip
    assert line.startswith(f"verdict True reachable at /ip4/{ip}/tcp/4002/p2p/"), line
    assert line.endswith("(3 of 3 peers dialled it back)"), line


@pytest.mark.parametrize("home", ["cone-drop", "symmetric-rst"])
def test_a_home_behind_nat_is_not_reachable(bed: Bed, witnesses: list[str], home: str) -> None:
    line = check(bed, home, witnesses)
    assert line == "verdict False behind NAT: running outbound-only (0 of 3 peers dialled it back)"


def test_announcing_the_routers_address_without_a_port_forward_is_not_reachable(
    bed: Bed, witnesses: list[str]
) -> None:
    wan = bed.hosts["cone-drop"].public_ip
    line = check(bed, "cone-drop", witnesses, announce=f"/ip4/{wan}/tcp/4002")
    assert line.startswith("verdict False behind NAT"), line


def test_a_home_with_its_port_forwarded_is_reachable_at_its_routers_address(
    bed: Bed, witnesses: list[str]
) -> None:
    bed.forward_port("cone-rst", 4002)
    wan = bed.hosts["cone-rst"].public_ip
    line = check(bed, "cone-rst", witnesses, announce=f"/ip4/{wan}/tcp/4002")
    assert line.startswith(f"verdict True reachable at /ip4/{wan}/tcp/4002/p2p/"), line


@pytest.mark.parametrize(("host", "reachable"), [("tokyo", True), ("symmetric-drop", False)])
def test_a_node_tries_upnp_quietly_checks_itself_and_signs_the_verdict_into_its_card(
    bed: Bed, witnesses: list[str], host: str, reachable: bool
) -> None:
    """No router of the bed speaks UPnP: the attempt costs one line in the log."""
    done = bed.run(host, [*PEER, "node", "4003", *witnesses], timeout_s=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == (
        "log UPnP: no port mapping (no UPnP device answered on this network); "
        "peers reach this node only as it is"
    ), lines
    assert lines[1].startswith(f"verdict {reachable} "), lines
    assert lines[2] == f"card {reachable}", lines
