"""The dashboard and the API docs in a real headless Chromium (Debian's, driven by Selenium
through its chromedriver), served by the node's API on a real socket. The browser can resolve no
host but 127.0.0.1, as on a machine offline, and every request it makes is recorded: the pages
must load from the node alone. The dashboard's numbers are the API's, its charts render, and a
screenshot is written; Swagger UI renders every route. CI (``.ci/run``) installs Chromium; with
``CI`` set, a missing browser fails instead of skipping."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

from gwtf.api.app import DASHBOARD, create_app
from gwtf.api.schemas import DiskUse, HistoryPoint, StakeHold
from gwtf.node.chain.epochs import EpochBook
from gwtf.node.local_api.server import bind_api_socket, serve_api
from gwtf.node.local_api.views import NodeViews
from gwtf.node.store.database import Database
from tests.api.conftest import DATA_NODE, NOW, TOKEN, UNITS, WORKING, add_work, times_of

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    if not (CHROMIUM and CHROMEDRIVER and (DASHBOARD / "index.html").is_file()):
        why = "needs Debian's chromium and chromium-driver and the built dashboard (npm ci)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: it {why}")
        pytest.skip(f"the browser test {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1600",
                 "--disable-dev-shm-usage",
                 # Offline: any other host's name fails to resolve, as with no network.
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):  # fmt: skip
        options.add_argument(flag)
    # The DevTools log of every request the pages make (``requested``).
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_dashboard_shows_the_apis_numbers_and_draws_its_charts(
    browser: WebDriver, views: NodeViews, db: Database, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # A relay named "node": the heading must not read "GWTF node node". Its next reward can be
    # claimed in 47 minutes; its data takes 1.2 MB.
    disk = DiskUse(
        database_bytes=234_567, evidence_bytes=1_000_000, total_bytes=1_234_567, measured_at=0
    )
    restate(views, name="node", next_claim_at=NOW + 2820, next_claim_in_s=2820, disk=disk)
    # Epoch 2 (settled) was worked, and no data node submitted a certificate of it.
    add_work(db, 2)
    chain = views.box.chain
    assert chain is not None
    view = replace(
        chain.view,
        times={**chain.view.times, 2: times_of(2)},
        books={**chain.view.books, 2: EpochBook(0, 0, False, 0, 0, False)},
        certified_by={2: frozenset()},
    )
    views.box.chain = replace(chain, view=view)
    app = create_app(views, token=TOKEN)
    server = serve_api(app, bind_api_socket("127.0.0.1", 0))
    try:
        api = TestClient(app)
        status, earnings = api.get("/v1/status").json(), api.get("/v1/earnings").json()
        driver = browser
        driver.get(server.url + "/")
        wait = WebDriverWait(driver, 20)

        def shown(element_id: str) -> str:
            return str(driver.find_element(By.ID, element_id).text)

        wait.until(lambda _: shown("claimed-eth") not in ("", "…"))
        assert shown("health") == status["health"]["status"] == "ok"
        assert driver.find_element(By.TAG_NAME, "h1").text == "GWTF · node"
        assert driver.title == "node · GWTF"
        assert shown("iteration") == str(status["iteration"])
        assert shown("role") == status["role"]
        assert shown("next-claim") == "in 47 min" and status["next_claim_in_s"] == 2820
        assert shown("disk") == "1.2 MB" and status["disk"]["total_bytes"] == 1_234_567
        title = driver.find_element(By.ID, "disk").get_attribute("title")
        assert title == "database 234.6 kB, evidence 1.0 MB"
        assert shown("claimed-eth") == earnings["total_claimed"]["eth"] == "0.3"
        # Read in one go: the page redraws the table every two seconds.
        epochs = driver.execute_script(
            "return [...document.querySelectorAll('#earnings tbody tr')]"
            ".map((r) => [r.className, [...r.cells].map((c) => c.textContent)])"
        )
        assert len(epochs) == len(earnings["epochs"]) == 3
        ((_, cells),) = [row for row in epochs if row[0] == "missed"]
        assert cells[:2] == ["2", "missed"] and cells[5] == str(3 * UNITS)
        # The API's reason, its address shortened as the page shows addresses.
        said = next(e["missed"] for e in earnings["epochs"] if e["epoch"] == 2)
        address = re.search(r"0x[0-9a-fA-F]{40}", said)
        assert address is not None and address[0].lower() == DATA_NODE
        assert cells[-1] == said.replace(address[0], f"{address[0][:8]}…{address[0][-4:]}")
        wait.until(lambda _: len(driver.find_elements(By.CSS_SELECTOR, "#receipts tbody tr")) == 10)
        assert "downstream" in shown("pipeline") and "stage 2" in shown("pipeline")
        # uPlot draws into a canvas, sized to its box.
        canvas = driver.find_element(By.CSS_SELECTOR, "#throughput-chart canvas")
        assert canvas.size["width"] >= 300 and canvas.size["height"] > 0
        # A relay is not sent the loss: the chart's place says where it is computed.
        assert not driver.find_element(By.ID, "loss-chart").is_displayed()
        assert "computed on the run's data nodes" in shown("loss-note")
        assert shown("loss") == "on data nodes" == shown("validation-loss")
        fetched = [u for u in requested(driver) if not u.startswith("data:")]
        assert fetched and [u for u in fetched if not u.startswith(server.url + "/")] == []
        time.sleep(0.2)
        shot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        server.stop()


def test_a_data_nodes_dashboard_charts_its_loss(browser: WebDriver, views: NodeViews) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    snapshot = views.box.get()
    now = snapshot.status.updated_at
    # Validated every 10 iterations: the held-out loss holds between measurements.
    history = tuple(
        HistoryPoint(
            t=now - 30 + i,
            throughput_hops_per_s=4.0,
            loss=5.0 - i / 10,
            validation_loss=None if i < 10 else 5.5 - (i // 10) / 2,
        )
        for i in range(30)
    )
    restate(views, name="data-0", role="data", stage=0, loss=2.125, validation_loss=4.5,
            validation_iteration=20, validation_verified=False)  # fmt: skip
    views.box.snapshot = replace(views.box.get(), history=history)
    server = serve_api(create_app(views, token=TOKEN), bind_api_socket("127.0.0.1", 0))
    try:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 20)
        wait.until(lambda _: browser.find_element(By.ID, "loss").text == "2.1250")
        assert browser.find_element(By.TAG_NAME, "h1").text == "GWTF · data-0"
        canvas = browser.find_element(By.CSS_SELECTOR, "#loss-chart canvas")
        assert canvas.size["width"] >= 300 and canvas.size["height"] > 0
        assert not browser.find_element(By.ID, "loss-note").is_displayed()
        # The chart holds the history's losses (uPlot keeps the series it drew).
        drawn = browser.execute_script("return charts['loss-chart'].data.slice(1)")
        assert drawn == [[p.loss for p in history], [p.validation_loss for p in history]]
        validation = browser.find_element(By.ID, "validation-loss")
        assert validation.text == "4.5000 *"
        assert "one relay" in (validation.get_attribute("title") or "")
    finally:
        server.stop()


def restate(views: NodeViews, **changes: object) -> None:
    """The views' snapshot with its status changed."""
    snapshot = views.box.get()
    views.box.snapshot = replace(snapshot, status=snapshot.status.model_copy(update=changes))


def requested(driver: WebDriver) -> list[str]:
    """The URLs the browser asked for since the last call (DevTools' network log)."""
    entries = driver.get_log("performance")  # type: ignore[no-untyped-call]
    messages = (json.loads(entry["message"])["message"] for entry in entries)
    return [
        m["params"]["request"]["url"]
        for m in messages
        if m["method"] == "Network.requestWillBeSent"
    ]


def test_the_api_docs_render_offline_from_the_nodes_own_assets(
    browser: WebDriver, views: NodeViews
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    app = create_app(views, token=TOKEN)
    server = serve_api(app, bind_api_socket("127.0.0.1", 0))
    try:
        driver = browser
        driver.get(server.url + "/docs")
        routes = len(TestClient(app).get("/openapi.json").json()["paths"])

        def operations() -> int:
            return len(driver.find_elements(By.CSS_SELECTOR, ".opblock"))

        # Swagger UI draws one block per operation once it has read the schema.
        WebDriverWait(driver, 20).until(lambda _: operations() >= routes)
        title = driver.find_element(By.CSS_SELECTOR, ".info .title").text
        assert title.startswith("GWTF node")
        urls = requested(driver)
        assert server.url + "/assets/swagger-ui/swagger-ui-bundle.js" in urls
        assert server.url + "/openapi.json" in urls
        # Inline images (data: URLs) are part of the assets; anything else is the node's.
        fetched = [u for u in urls if not u.startswith("data:")]
        assert [u for u in fetched if not u.startswith(server.url + "/")] == []
    finally:
        server.stop()


def test_the_dashboard_shows_what_holds_the_stake_and_which_claims_wait(
    browser: WebDriver, views: NodeViews
) -> None:
    """A tensor dispute freezes the stake and its epoch's claim: the dashboard lists the holds
    as the API words them, and the disputed epoch of this run reads frozen until the court
    rules or the grace ends, instead of claimable; a hold of another run, or one whose grace
    is over (only the stake waits for its release), leaves the epoch claimable."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def hold(number: int, run: int, epoch: int, until: int | None, over: bool = False) -> StakeHold:
        return StakeHold(
            dispute_id=number, run_id=run, epoch=epoch, until=until, releasable=over,
            detail=f"stake frozen by dispute {number} (run {run}, epoch {epoch})",
        )  # fmt: skip

    def hold_on(*holds: StakeHold) -> None:
        chain = views.box.chain
        assert chain is not None and chain.node is not None
        node = chain.node.model_copy(update={"stake_holds": list(holds)})
        views.box.chain = replace(chain, node=node)

    until = NOW + 3600
    hold_on(hold(3, 1, 0, until), hold(4, 2, WORKING, None))
    server = serve_api(create_app(views, token=TOKEN), bind_api_socket("127.0.0.1", 0))
    try:
        earnings = TestClient(create_app(views, token=TOKEN)).get("/v1/earnings").json()
        claimable = {e["epoch"]: e["claimable"]["eth"] for e in earnings["epochs"]}
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 20)

        def claimable_cells() -> dict[int, tuple[str, str]]:
            rows = browser.execute_script(
                "return [...document.querySelectorAll('#earnings tbody tr')]"
                ".map((r) => [r.className, [...r.cells].map((c) => c.textContent)])"
            )
            return {int(cells[0]): (kind, cells[7]) for kind, cells in rows}

        def listed() -> list[str]:
            return [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#holds li")]

        wait.until(lambda _: len(listed()) == 2)
        assert browser.find_element(By.ID, "holds").is_displayed()
        assert listed() == [h["detail"] for h in earnings["stake_holds"]]
        when = datetime.datetime.fromtimestamp(until, tz=datetime.UTC)
        assert claimable_cells() == {
            0: ("frozen", f"{claimable[0]} frozen until {when:%Y-%m-%d %H:%M} UTC"),
            WORKING: ("", claimable[WORKING]),  # held in another run
        }
        hold_on(hold(5, 1, WORKING, None), hold(3, 1, 0, until, over=True))
        wait.until(lambda _: claimable_cells()[WORKING][0] == "frozen")
        assert claimable_cells() == {
            0: ("", claimable[0]),  # its grace is over: the claim no longer waits
            WORKING: ("frozen", f"{claimable[WORKING]} frozen until the court rules"),
        }
        hold_on()
        wait.until(lambda _: not browser.find_element(By.ID, "holds").is_displayed())
        assert claimable_cells()[WORKING] == ("", claimable[WORKING])
    finally:
        server.stop()
