"""The local API's routes over a real node database: every answer in its schema, receipts page
by page, earnings by the contract's formula, the token on the one mutating route, metrics in
Prometheus' text format."""

from __future__ import annotations

import socket
from dataclasses import replace

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from web3 import Web3

from gwtf.api.app import MAX_PAGE, create_app
from gwtf.api.schemas import ReceiptView
from gwtf.api.services import Refused
from gwtf.contracts.encoding import HopBatch, hop_key, receipt_digest, sign_receipt
from gwtf.contracts.merkle import build_tree, verify_proof
from gwtf.node.local_api.service import hosts_of
from gwtf.node.local_api.snapshot import SnapshotBox
from gwtf.node.local_api.views import NodeViews
from gwtf.node.store.batches import WORKER, BatchStore, ClosedBatch
from gwtf.node.store.database import Database
from gwtf.node.store.models import RECEIPT_COLUMNS
from tests.api.conftest import DATA_NODE, DOMAIN, NODE, PEER, TOKEN, UNITS, WORKING, receipt


def test_status_peers_and_health_come_from_the_snapshot(app: FastAPI) -> None:
    client = TestClient(app)
    assert client.get("/healthz").json() == {"status": "ok", "detail": ""}
    status = client.get("/v1/status").json()
    assert (status["role"], status["stage"], status["node_address"]) == ("relay", 1, NODE.address)
    (peer,) = client.get("/v1/peers").json()
    assert peer["place"] == "downstream"
    assert client.get("/v1/flows").json() == []


def test_a_node_not_started_yet_says_so_with_503(views: NodeViews, tmp_path) -> None:  # type: ignore[no-untyped-def]
    views.box = SnapshotBox()
    client = TestClient(create_app(views, token=TOKEN, dashboard_dir=tmp_path))
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["status"] == "starting"
    answer = client.get("/v1/status")
    assert answer.status_code == 503 and "starting" in answer.json()["detail"]
    assert client.get("/v1/earnings").status_code == 503  # the chain not read yet


def test_receipts_are_paged_newest_first_as_worker_and_as_receiver(app: FastAPI) -> None:
    client = TestClient(app)
    page = client.get("/v1/receipts", params={"limit": 5}).json()
    # 4 signed + 2 countersigned in each of two epochs.
    assert (page["total"], len(page["items"])) == (12, 5)
    rest = client.get("/v1/receipts", params={"limit": 5, "offset": 5}).json()["items"]
    keys = [r["hop_key"] for r in page["items"] + rest]
    assert len(set(keys)) == 10
    epoch3 = client.get("/v1/receipts", params={"epoch": WORKING, "limit": MAX_PAGE}).json()
    assert epoch3["total"] == 6 and {r["epoch"] for r in epoch3["items"]} == {WORKING}
    mine = [r for r in epoch3["items"] if r["as_worker"]]
    assert len(mine) == 4 and sum(r["counterparty_signature"] is None for r in mine) == 1
    assert all(r["worker"] == NODE.address for r in mine)
    assert client.get("/v1/receipts", params={"limit": MAX_PAGE + 1}).status_code == 422
    assert client.get("/v1/receipts", params={"offset": -1}).status_code == 422


def test_a_receipt_shows_every_field_of_the_receipt_it_signed(app: FastAPI) -> None:
    (item,) = [
        r for r in TestClient(app).get("/v1/receipts", params={"limit": MAX_PAGE}).json()["items"]
        if r["epoch"] == WORKING and r["microbatch_id"] == 1
    ]  # fmt: skip
    signed = receipt(WORKING, 1, NODE.address, PEER.address)
    assert item == {
        "hop_key": "0x" + hop_key(signed).hex(), "run_id": 1, "epoch": WORKING,
        "data_node": Web3.to_checksum_address(DATA_NODE), "iteration": 0, "microbatch_id": 1,
        "stage": 1, "direction": "backward", "attempt": 0, "worker": NODE.address,
        "counterparty": PEER.address, "input_digest": "0x" + "01" * 32,
        "output_digest": "0x" + "02" * 32, "units": UNITS,
        "receipt_digest": "0x" + receipt_digest(signed, DOMAIN).hex(),
        "worker_signature": "0x" + sign_receipt(signed, DOMAIN, NODE.key).hex(),
        "counterparty_signature": item["counterparty_signature"], "as_worker": True,
        # A batch of one: its root is the receipt's digest, its proof empty.
        "batch_root": "0x" + receipt_digest(signed, DOMAIN).hex(), "batch_proof": [],
        "proof": None,
    }  # fmt: skip
    assert set(ReceiptView.model_fields) >= set(RECEIPT_COLUMNS.values())


def test_a_receipt_in_a_batch_of_several_shows_its_proof_to_the_root_both_signed(
    db: Database, app: FastAPI
) -> None:
    epoch = WORKING + 1
    own = [receipt(epoch, m, NODE.address, PEER.address) for m in range(5)]
    digests = [receipt_digest(r, DOMAIN) for r in own]
    root = build_tree(digests).root
    store = BatchStore(db, DOMAIN)
    store.record(own, WORKER)
    batch = HopBatch(1, epoch, NODE.address, PEER.address, root)
    store._commit(ClosedBatch(batch, tuple(hop_key(r) for r in own), b"\x01" * 65, None),
                  WORKER, digests)  # fmt: skip
    items = TestClient(app).get("/v1/receipts", params={"epoch": epoch}).json()["items"]
    assert len(items) == 5 and {r["batch_root"] for r in items} == {"0x" + root.hex()}
    for item in items:
        proof = [bytes.fromhex(h[2:]) for h in item["batch_proof"]]
        leaf = bytes.fromhex(item["receipt_digest"][2:])
        assert proof and verify_proof(proof, root, leaf)


def test_earnings_follow_the_contracts_formula_beside_the_chains_view(app: FastAPI) -> None:
    earnings = TestClient(app).get("/v1/earnings").json()
    epoch0, epoch3 = earnings["epochs"]
    # Epoch 0: settled, 3 hops' units of 10 certified, a 1 ETH budget: 0.3 ETH, claimed.
    assert epoch0["phase"] == "settled" and epoch0["units_worked"] == 3 * UNITS
    assert epoch0["expected"] == {"wei": str(3 * 10**17), "eth": "0.3"}
    assert epoch0["claimed"] == epoch0["chain_claimed"] == epoch0["expected"]
    assert epoch0["claimable"]["wei"] == "0"
    # The epoch being worked: no certificate yet, nothing expected so far.
    assert epoch3["phase"] == "working" and epoch3["expected"] is None
    assert earnings["total_claimed"]["eth"] == "0.3"


def test_claim_needs_the_token_and_a_node_that_claims(app: FastAPI) -> None:
    client = TestClient(app)
    assert client.post("/v1/claim", json={}).status_code == 401
    wrong = {"Authorization": "Bearer " + "x" * 32}
    assert client.post("/v1/claim", json={}, headers=wrong).status_code == 401
    right = {"Authorization": f"Bearer {TOKEN}"}
    refused = client.post("/v1/claim", json={"epoch": 0}, headers=right)
    assert refused.status_code == 409 and "wallet" in refused.json()["detail"]
    assert client.post("/v1/claim", json={"epoch": -1}, headers=right).status_code == 422


def test_claim_runs_on_the_nodes_loop_and_answers_its_records(views: NodeViews, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import trio

    asked: list[int | None] = []

    async def claim_now(epoch: int | None) -> list[int]:
        asked.append(epoch)
        if epoch == 3:
            raise Refused("epoch 3 has not settled")
        return [0]

    async def main() -> tuple[int, dict, int]:  # type: ignore[type-arg]
        views.claim_now, views.trio_token = claim_now, trio.lowlevel.current_trio_token()
        client = TestClient(create_app(views, token=TOKEN, dashboard_dir=tmp_path))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        ok = await trio.to_thread.run_sync(
            lambda: client.post("/v1/claim", json={"epoch": 0}, headers=headers)
        )
        refused = await trio.to_thread.run_sync(
            lambda: client.post("/v1/claim", json={"epoch": 3}, headers=headers)
        )
        return ok.status_code, ok.json(), refused.status_code

    code, body, refused = trio.run(main)
    assert code == 200 and body["asked"] == [0] and body["claims"][0]["status"] == "confirmed"
    assert refused == 409 and asked == [0, 3]


def test_metrics_are_prometheus_text(app: FastAPI) -> None:
    answer = TestClient(app).get("/metrics")
    assert answer.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(answer.text)}
    assert families["gwtf_hops_computed"].samples[0].value == 14.0
    assert families["gwtf_hops_computed"].type == "counter"
    assert families["gwtf_peers_alive"].type == "gauge"


def test_the_openapi_schema_is_served_and_cors_is_off(app: FastAPI) -> None:
    client = TestClient(app)
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/status", "/v1/earnings", "/v1/receipts", "/v1/claim", "/metrics"} <= set(paths)
    answer = client.get("/v1/status", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in answer.headers
    missing = client.get("/")
    assert missing.status_code == 404 and "make install" in missing.json()["detail"]


def test_a_host_name_other_than_loopbacks_is_refused(views: NodeViews, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A page whose name was pointed at 127.0.0.1 (DNS rebinding) sends its own name.
    with socket.create_server(("127.0.0.1", 0)) as sock:
        hosts = hosts_of(sock)
    app = create_app(views, token=TOKEN, dashboard_dir=tmp_path, allowed_hosts=hosts)
    client = TestClient(app, base_url="http://127.0.0.1:8787")
    assert client.get("/v1/status").status_code == 200
    assert client.get("/v1/status", headers={"host": "localhost:8787"}).status_code == 200
    refused = client.get("/v1/status", headers={"host": "rebound.example:8787"})
    assert refused.status_code == 400


def test_the_node_as_the_chain_says_it_is_served_once_read(views: NodeViews) -> None:
    client = TestClient(create_app(views, token=TOKEN))
    answer = client.get("/v1/node").json()
    assert answer["node"] == NODE.address and answer["status"] == "active"
    assert answer["stake"] == {"wei": "2000000000000000000", "eth": "2"}
    assert answer["capacity"]["microbatches_per_hour"] == 600
    # Not registered: 503, saying so.
    assert views.box.chain is not None
    views.box.chain = replace(views.box.chain, node=None)
    unregistered = client.get("/v1/node")
    assert unregistered.status_code == 503 and "not registered" in unregistered.json()["detail"]
