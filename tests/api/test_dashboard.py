"""The dashboard in a real headless Chromium (Debian's, driven by Selenium through its
chromedriver): served by the node's API on a real socket, the page loads, its numbers are the
API's, the charts render, and a screenshot is written. CI (``.ci/run``) installs Chromium; with
``CI`` set, a missing browser fails instead of skipping."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import DASHBOARD, create_app
from node.local_api.server import bind_api_socket, serve_api
from node.local_api.views import NodeViews
from tests.api.conftest import TOKEN

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser() -> Iterator[object]:
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
                 "--disable-dev-shm-usage"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_dashboard_shows_the_apis_numbers_and_draws_its_charts(
    browser: object, views: NodeViews, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    app = create_app(views, token=TOKEN)
    server = serve_api(app, bind_api_socket("127.0.0.1", 0))
    try:
        api = TestClient(app)
        status, earnings = api.get("/v1/status").json(), api.get("/v1/earnings").json()
        driver = browser  # type: ignore[assignment]
        driver.get(server.url + "/")  # type: ignore[attr-defined]
        wait = WebDriverWait(driver, 20)

        def shown(element_id: str) -> str:
            return str(driver.find_element(By.ID, element_id).text)  # type: ignore[attr-defined]

        wait.until(lambda _: shown("claimed-eth") not in ("", "…"))
        assert shown("health") == status["health"]["status"] == "ok"
        assert shown("iteration") == str(status["iteration"])
        assert shown("role") == status["role"]
        assert shown("claimed-eth") == earnings["total_claimed"]["eth"] == "0.3"
        epochs = driver.find_elements(By.CSS_SELECTOR, "#earnings tbody tr")  # type: ignore[attr-defined]
        assert len(epochs) == len(earnings["epochs"])
        wait.until(lambda _: len(driver.find_elements(By.CSS_SELECTOR, "#receipts tbody tr")) == 10)  # type: ignore[attr-defined]
        assert "downstream" in shown("pipeline") and "stage 2" in shown("pipeline")
        # uPlot draws into a canvas per chart, sized to its box.
        for chart in ("throughput-chart", "loss-chart"):
            canvas = driver.find_element(By.CSS_SELECTOR, f"#{chart} canvas")  # type: ignore[attr-defined]
            assert canvas.size["width"] >= 300 and canvas.size["height"] > 0
        time.sleep(0.2)
        shot = tmp_path / "dashboard.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000  # type: ignore[attr-defined]
    finally:
        server.stop()
