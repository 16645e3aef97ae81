"""Health: when a node counts as idle (nothing trains through it), and the code ``/healthz``
answers for each state (200 while it is up and takes part, idle included)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gwtf.api.app import create_app
from gwtf.api.schemas import Health
from gwtf.node.local_api.snapshot import Meter, data_node_idle, relay_idle
from gwtf.node.local_api.views import NodeViews
from tests.api.conftest import TOKEN


def test_a_data_node_is_idle_before_its_first_iteration_and_after_its_last() -> None:
    waiting = data_node_idle(training=False, finished=False)
    assert waiting is not None and "waiting for flows" in waiting
    assert data_node_idle(training=True, finished=False) is None
    done = data_node_idle(training=True, finished=True)
    assert done is not None and "done" in done


def test_a_relay_is_idle_after_a_minute_without_a_hop() -> None:
    meter = Meter()
    meter.rate(1000.0, 0)
    assert relay_idle(meter.hops_in_window()) is not None  # just started, nothing computed
    meter.rate(1010.0, 3)
    assert meter.hops_in_window() == 3 and relay_idle(meter.hops_in_window()) is None
    meter.rate(1050.0, 3)
    assert relay_idle(meter.hops_in_window()) is None  # a hop 40 s ago still counts
    meter.rate(1075.0, 3)  # the sample before the hop has left the minute kept
    assert meter.hops_in_window() == 0
    why = relay_idle(meter.hops_in_window())
    assert why is not None and "last minute" in why


@pytest.mark.parametrize(
    ("status", "code"),
    [("ok", 200), ("idle", 200), ("starting", 503), ("degraded", 503), ("stopping", 503)],
)
def test_healthz_answers_200_while_the_node_takes_part(
    views: NodeViews, tmp_path: Path, status: str, code: int
) -> None:
    snapshot = views.box.get()
    health = Health(status=status, detail="why")  # type: ignore[arg-type]
    views.box.snapshot = replace(
        snapshot, status=snapshot.status.model_copy(update={"health": health})
    )
    client = TestClient(create_app(views, token=TOKEN, dashboard_dir=tmp_path))
    answer = client.get("/healthz")
    assert answer.status_code == code and answer.json() == {"status": status, "detail": "why"}
    assert client.get("/v1/status").json()["health"]["status"] == status
