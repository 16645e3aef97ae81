"""Schemathesis against the API's own OpenAPI schema: for any input it generates, no route
answers 500 or breaks its schema (status codes, content types, bodies), the token-guarded
claim included. The app is the real one over a real node database (``conftest.fill``)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

from gwtf.api.app import create_app
from gwtf.node.local_api.snapshot import SnapshotBox
from gwtf.node.local_api.views import NodeViews
from gwtf.node.store.database import open_database
from gwtf.node.store.views import NodeRecords
from tests.api.conftest import NODE, TOKEN, chain_parts, fill, snapshot


def _app():  # type: ignore[no-untyped-def]
    folder = Path(tempfile.mkdtemp(prefix="gwtf-api-fuzz-"))
    db = open_database(f"sqlite:///{folder / 'node.sqlite'}")
    atexit.register(lambda: (db.close(), shutil.rmtree(folder, ignore_errors=True)))
    fill(db)
    chain = chain_parts()
    views = NodeViews(SnapshotBox(snapshot(chain), chain), NodeRecords(db), 1, NODE.address)
    return create_app(views, token=TOKEN, dashboard_dir=folder)


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_breaks_the_api(case: schemathesis.Case) -> None:
    # Generated bearer tokens are wrong ones (401, as the schema says); the right token's
    # claim is ``test_app``'s.
    case.call_and_validate()
