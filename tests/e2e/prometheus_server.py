"""A real Prometheus server (Debian's `prometheus`) on 127.0.0.1 for the end-to-end tests: it
loads a rendered scrape config and rule file, listens on loopback only, keeps its TSDB in a
temporary directory, and is read through its HTTP API (/api/v1/query, /alerts, /targets).
`alerts_page` shows its own UI in headless Chromium: Debian's build serves the classic UI
(server-rendered at each request) under /classic/, its React UI is not packaged.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from onboarding.common.processes import free_port

PROMETHEUS = shutil.which("prometheus")


class PrometheusApi:
    def __init__(self, base_url: str):
        self.base_url = base_url

    def get(self, path: str, **params: str) -> dict[str, Any]:
        """The API's JSON; an error answer (a query that does not parse: HTTP 400) is returned
        as the server wrote it, status "error" and its errorType."""
        url = f"{self.base_url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def query(self, expr: str) -> dict[str, Any]:
        return self.get("/api/v1/query", query=expr)

    def alerts(self) -> list[dict[str, Any]]:
        return self.get("/api/v1/alerts")["data"]["alerts"]

    def wait_for(self, what: str, probe: Callable[[], Any], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if value := probe():
                return value
            time.sleep(0.5)
        raise AssertionError(f"Prometheus at {self.base_url}: {what} not seen within "
                             f"{timeout_s:.0f} s")


@contextmanager
def prometheus_server(config: Path, data_dir: Path, log: Path) -> Iterator[PrometheusApi]:
    port = free_port()
    argv = [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    api = PrometheusApi(f"http://127.0.0.1:{port}")
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited {proc.returncode}: "
                                     f"{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{api.base_url}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        api.wait_for("/-/ready", ready, 60)
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def alerts_page(viewport: tuple[int, int] = (1280, 800)) -> Iterator[Callable[..., str]]:
    """Headless Chromium started up front; yields `shoot(api, alertname, path)`: the server's
    Alerts page (/classic/alerts) loaded, that alert's row and its annotations opened, a
    screenshot at `path`, and the state the page shows for it ("firing", "pending") returned.
    The page is rendered by the server when it is requested, so it shows the alert as it was
    then, whatever happens after."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.test_ui import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        raise AssertionError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})

        def shoot(api: PrometheusApi, alertname: str, path: Path) -> str:
            page.goto(f"{api.base_url}/classic/alerts")
            header = page.locator("tr.alert_header", has_text=alertname)
            header.click()  # its rule, labels, state and value
            page.click("button.show-annotations")  # where each threshold came from
            details = header.locator("xpath=following-sibling::tr[1]")
            state = details.locator(".state_indicator").first.inner_text().strip().lower()
            path.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(path), full_page=True)
            return state

        try:
            yield shoot
        finally:
            browser.close()
