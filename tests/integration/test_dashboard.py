"""The dashboard at / of the admin endpoint, loaded in headless Chromium (Debian's chromium,
installed by .ci/install-deps): a destination flooded past its stop threshold shows as
stopped within a few seconds, and the page renders on a laptop and a phone."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from .clients import Producer, make_message, start, unique
from .harness.net import free_port
from .harness.router import StartRouter

pytestmark = pytest.mark.integration

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Lets the page's first fetches and timers run before the DOM is taken.
    "--virtual-time-budget=3000",
]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed (bash .ci/install-deps installs it)", pytrace=False)
    return path


def browse(url: str, *flags: str) -> str:
    """What Chromium prints for ``url`` with ``flags`` (the DOM with --dump-dom)."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags, url],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Rows(HTMLParser):
    """The destination rows of the page: name -> (data-flow-stopped, the row's cell texts)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, tuple[str, list[str]]] = {}
        self._row: str | None = None
        self._cells: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and found.get("data-destination") is not None:
            self._row, self._cells = str(found["data-destination"]), []
            self.rows[self._row] = (str(found.get("data-flow-stopped")), self._cells)

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and data.strip():
            self._cells.append(data.strip())


def destinations_shown(url: str) -> dict[str, tuple[str, list[str]]]:
    parser = Rows()
    parser.feed(browse(url, "--dump-dom"))
    return parser.rows


def test_a_flooded_destination_shows_as_stopped(qpid_flow_process: StartRouter, tmp_path: Path) -> None:
    name = unique("dash")
    # Seed 000's numbers: max 1000, stop at 900, resume at 500.
    config = f'[destinations."{name}"]\nmax_count = 1000\nflow_stop_count = 900\nflow_resume_count = 500\n'
    admin = f"127.0.0.1:{free_port()}"
    router = qpid_flow_process(config_text=config, extra_args=["--admin", admin])
    page = f"http://{admin}/"

    flag, cells = destinations_shown(page)[name]
    assert flag == "false" and "flowing" in cells, cells

    producer = Producer(router.url, name, [make_message("flood", i) for i in range(950)], timeout=120)
    start(producer)
    deadline = time.monotonic() + 20
    shown: dict[str, tuple[str, list[str]]] = {}
    while time.monotonic() < deadline:
        shown = destinations_shown(page)
        if shown[name][0] == "true":
            break
    flag, cells = shown[name]
    assert flag == "true", cells
    assert "stopped" in cells and "901 msgs / 1000" in cells and "stop 900 | resume 500" in cells, cells
    assert cells[cells.index("stopped") + 1] == "1", cells  # times stopped

    for width, height, png in ((1280, 900, "laptop.png"), (390, 844, "phone.png")):
        browse(page, f"--window-size={width},{height}", f"--screenshot={tmp_path / png}")
        assert (tmp_path / png).stat().st_size > 20_000, f"{png}: an empty page?"


def test_names_from_clients_are_shown_as_text(qpid_flow_process: StartRouter) -> None:
    """A destination named with markup is shown as those characters, not run as HTML."""
    name = "dash.<b>bold</b><img src=x>"
    admin = f"127.0.0.1:{free_port()}"
    qpid_flow_process(config_text=f'[destinations."{name}"]\nmax_count = 10\n', extra_args=["--admin", admin])
    dom = browse(f"http://{admin}/", "--dump-dom")
    assert "dash.&lt;b&gt;bold&lt;/b&gt;&lt;img src=x&gt;" in dom
    assert "<img src=" not in dom
