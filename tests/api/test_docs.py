"""``/docs`` is served from the package's own Swagger UI assets: the page and its stylesheet
name no other host, and every asset it loads is served. (``test_dashboard.py`` renders it in a
browser that can reach no other host.)"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gwtf.api.app import DASHBOARD, create_app
from gwtf.node.local_api.views import NodeViews
from tests.api.conftest import TOKEN


class Links(HTMLParser):
    """The URLs a page loads: scripts, stylesheets, icons, images."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.urls.append(value)


@pytest.fixture
def built() -> Path:
    if not (DASHBOARD / "swagger-ui" / "swagger-ui-bundle.js").is_file():
        if os.environ.get("CI"):
            pytest.fail("CI must build the docs' assets (npm ci) before the tests")
        pytest.skip("the docs' assets are not built (npm ci)")
    return DASHBOARD


def test_the_docs_load_only_the_packages_own_assets(views: NodeViews, built: Path) -> None:
    client = TestClient(create_app(views, token=TOKEN, dashboard_dir=built))
    page = client.get("/docs")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    links = Links()
    links.feed(page.text)
    assert len(links.urls) == 3  # the bundle, its stylesheet, the icon
    assert "://" not in page.text and "//cdn" not in page.text, "the page names another host"
    assert '"validatorUrl": null' in page.text  # no schema sent out to be validated
    for url in links.urls:
        assert url.startswith("/assets/swagger-ui/"), url
        asset = client.get(url)
        kept = built / url.removeprefix("/assets/")
        assert asset.status_code == 200 and asset.content == kept.read_bytes() != b"", url
    # The stylesheet imports nothing (no web fonts) and its images are inline.
    css = client.get("/assets/swagger-ui/swagger-ui.css").text
    assert "@import" not in css and not re.search(r"url\(\s*['\"]?(https?:)?//", css)
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/redoc").status_code == 404  # off: its page fetches web fonts


def test_without_built_assets_the_docs_say_how_to_build_them(
    views: NodeViews, tmp_path: Path
) -> None:
    client = TestClient(create_app(views, token=TOKEN, dashboard_dir=tmp_path / "not-built"))
    answer = client.get("/docs")
    assert answer.status_code == 404 and "make install" in answer.json()["detail"]
