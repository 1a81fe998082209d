"""Helpers for the real-browser UI test: a `dagster dev` process and a headless Chromium.

Nothing here is downloaded at run time: Chromium and its driver are Debian's (`chromium`,
`chromium-driver`), and Selenium is handed both paths so it never calls Selenium Manager.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# The viewport of every screenshot (CSS pixels). Headless Chromium's --window-size includes
# window decorations, so the viewport is set through DevTools instead.
VIEWPORT = (1600, 1000)
# `dagster dev` ignores SIGINT when started from a non-interactive shell; restore the default so
# that SIGINT to its process group shuts it down cleanly.
SIGINT_DEFAULT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)
T = TypeVar("T")
WORKSPACE_QUERY = """{ workspaceOrError { __typename ... on Workspace { locationEntries {
  name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(url: str, query: str) -> dict:
    body = json.dumps({"query": query}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


@dataclass
class DagsterDev:
    """A running `dagster dev` (webserver, daemon, code server) in its own process group."""

    proc: subprocess.Popen
    url: str
    log: Path

    def location_status(self) -> tuple[bool, str]:
        """(every code location loaded, description) from the webserver's GraphQL API."""
        data = _graphql(f"{self.url}/graphql", WORKSPACE_QUERY)["data"]["workspaceOrError"]
        entries = data.get("locationEntries") or []
        state = [(e["name"], e["loadStatus"], e["locationOrLoadError"]) for e in entries]
        for name, _, loaded in state:
            if loaded and loaded["__typename"] == "PythonError":
                raise RuntimeError(f"code location {name} failed to load: {loaded['message']}")
        ready = bool(state) and all(
            status == "LOADED" and loaded and loaded["__typename"] == "RepositoryLocation"
            for _, status, loaded in state
        )
        return ready, repr(state)

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the webserver answers and every code location is loaded."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"dagster dev exited with {self.proc.returncode}; see {self.log}:\n"
                    + self.log.read_text()[-3000:]
                )
            try:
                ready, last = self.location_status()
                if ready:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError) as exc:
                last = repr(exc)
            time.sleep(0.5)
        raise TimeoutError(f"dagster dev at {self.url} not ready after {timeout_s} s ({last})")

    def stop(self, timeout_s: float = 30) -> None:
        """SIGINT the process group (a clean shutdown), SIGKILL it if that takes too long."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        # Children (webserver, daemon, code server) share the group; make sure none outlives us.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout_s)


def start_dagster_dev(cwd: Path, env: dict[str, str], log: Path) -> DagsterDev:
    """Launch `dagster dev -w workspace.yaml` on a free local port, in its own process group.

    Returns at once; call `wait_ready` before using it and `stop` when done.
    """
    port = free_port()
    dagster = Path(sys.executable).with_name("dagster")
    cmd = [sys.executable, "-c", SIGINT_DEFAULT, str(dagster), "dev", "-w", "workspace.yaml"]
    cmd += ["-h", "127.0.0.1", "-p", str(port)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return DagsterDev(proc, f"http://127.0.0.1:{port}", log)


@contextlib.contextmanager
def dagster_dev(
    cwd: Path, env: dict[str, str], log: Path, ready_timeout_s: float = 120
) -> Iterator[DagsterDev]:
    """A ready `dagster dev`, always stopped afterwards."""
    server = start_dagster_dev(cwd, env, log)
    try:
        server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def chromium() -> Iterator[WebDriver]:
    """Headless Chromium with a fresh profile and no network side traffic."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
        ):
            opts.add_argument(arg)
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
        try:
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {
                    "width": VIEWPORT[0],
                    "height": VIEWPORT[1],
                    "deviceScaleFactor": 1,
                    "mobile": False,
                },
            )
            yield driver
        finally:
            driver.quit()


def xpath_literal(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    return "concat('" + "', \"'\", '".join(text.split("'")) + "')"


def graph_node_xpath(asset: str) -> str:
    """A node of the asset graph (drawn as SVG foreignObjects) labelled exactly `asset`."""
    return f"//*[local-name()='foreignObject']//*[normalize-space(text())={xpath_literal(asset)}]"


def drawn_graph_nodes(driver: WebDriver, assets: list[str]) -> list[str]:
    return [a for a in assets if driver.find_elements(By.XPATH, graph_node_xpath(a))]


def wait_for_graph_nodes(driver: WebDriver, assets: list[str], timeout_s: float) -> None:
    """Wait until the asset graph draws a node for every one of `assets`; AssertionError if not."""
    try:
        WebDriverWait(driver, timeout_s).until(
            lambda d: len(drawn_graph_nodes(d, assets)) == len(assets)
        )
    except TimeoutException:
        missing = sorted(set(assets) - set(drawn_graph_nodes(driver, assets)))
        raise AssertionError(
            f"the asset graph at {driver.current_url} shows no node for {missing} "
            f"after {timeout_s} s"
        ) from None


def wait_until(
    driver: WebDriver, condition: Callable[[WebDriver], T | None], timeout_s: float, what: str
) -> T:
    """The first truthy value of `condition`; AssertionError naming `what` if none comes. An
    element the page re-rendered between finding and inspecting it only means: look again."""
    try:
        wait = WebDriverWait(
            driver, timeout_s, ignored_exceptions=(StaleElementReferenceException,)
        )
        return wait.until(lambda d: condition(d) or False)
    except TimeoutException:
        raise AssertionError(f"{driver.current_url} shows no {what} after {timeout_s} s") from None


def wait_for(driver: WebDriver, xpath: str, timeout_s: float, what: str) -> WebElement:
    """The first element matching `xpath`; AssertionError naming `what` if none shows up."""
    return wait_until(
        driver, lambda d: next(iter(d.find_elements(By.XPATH, xpath)), None), timeout_s, what
    )


def wait_until_still(driver: WebDriver, xpath: str, timeout_s: float) -> None:
    """Wait until the elements matching `xpath` stop moving (graph layout and zoom animations)."""
    last: list = []
    still = 0

    def settled(d: WebDriver) -> bool:
        nonlocal last, still
        rects = [e.rect for e in d.find_elements(By.XPATH, xpath)]
        still = still + 1 if rects and rects == last else 0
        last = rects
        return still >= 3

    WebDriverWait(
        driver,
        timeout_s,
        poll_frequency=0.3,
        ignored_exceptions=(StaleElementReferenceException,),
    ).until(settled)


@contextlib.contextmanager
def screenshot_on_failure(driver: WebDriver, path: Path) -> Iterator[None]:
    """Keep what the browser showed when an assertion inside the block failed."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            screenshot(driver, path)
        raise


def screenshot(driver: WebDriver, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path)), f"could not write {path}"
    return path
