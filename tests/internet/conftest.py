"""The internet test bed as a fixture: three regions' public hosts and homes behind each kind of
router (``testbed.py``). It needs root, iproute2, iptables and conntrack; without them its tests
are skipped, saying why, except under ``CI``, where they fail (``.ci/run`` installs the tools
and runs as root)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.internet.testbed import Bed, HomeSpec, build_bed, missing_requirements

PUBLIC = {"oregon": "oregon", "tokyo": "tokyo", "frankfurt": "frankfurt"}
HOMES = (
    HomeSpec("cone-drop", "oregon", nat="cone", inbound="drop"),
    HomeSpec("cone-rst", "tokyo", nat="cone", inbound="rst"),
    HomeSpec("symmetric-drop", "frankfurt", nat="symmetric", inbound="drop"),
    HomeSpec("symmetric-rst", "oregon", nat="symmetric", inbound="rst"),
)


def require_testbed() -> None:
    problem = missing_requirements()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the internet test bed: {problem}")
    pytest.skip(problem)


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    """Public hosts in oregon, tokyo and frankfurt, and a home behind each kind of router."""
    require_testbed()
    with build_bed(PUBLIC, HOMES) as built:
        yield built
