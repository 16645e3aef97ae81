"""An auditor fetches the evidence of a relay behind a NAT through the node it is connected to
(``/gwtf/evidence-via/1.0.0``): nobody can dial the relay, yet its frame arrives whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.internet.test_testbed import Lines
from tests.internet.testbed import Bed

#: Namespaces, routers and libp2p hosts take seconds a test: CI runs these after the default run.
pytestmark = pytest.mark.slow

PEER = [sys.executable, "-m", "tests.internet.reach_peer"]


def test_a_home_relays_evidence_reaches_an_auditor_through_its_data_node(
    bed: Bed, tmp_path: Path
) -> None:
    forwarder = Lines(bed.popen("frankfurt", [*PEER, "forwarder"]))
    forwarder_address = forwarder.wait_for("address ").split()[1]
    home = Lines(bed.popen("cone-drop", [*PEER, "evidence-home", forwarder_address, str(tmp_path)]))
    digest = home.wait_for("digest ").split()[1]
    home_address = home.wait_for("address ").split()[1]
    argv = [*PEER, "audit", digest, home_address, forwarder_address]
    done = bed.run("tokyo", argv, timeout_s=60)
    assert done.returncode == 0, done.stderr[-2000:]
    # The relay itself could not be dialled; its frame (two chunks) came through the data node.
    assert done.stdout.split("\n")[:2] == ["reached True", f"fetched {3 << 19} bytes"], done.stdout
