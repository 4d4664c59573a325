"""The playground page (``GET /``, :mod:`lyre.api.http.playground`) in a real headless Chromium:
Debian's ``chromium`` driven by Playwright (never a browser Playwright downloads), against a real
server. The page loads and lists the voices, speaks over the WebSocket (frames, samples, the time to
first audio and the level meter shown), cancels mid-utterance (no frame after the cancel's answer,
the server's session ended), and on a keyed server refuses a bad key, speaks with a good one, and
keeps the key out of storage, cookies and every URL it requests.

Every wait is Playwright's, for a CSS selector of the page's own report (``#status``'s data
attributes: the page's Content-Security-Policy allows no script Playwright would evaluate), with
generous timeouts; nothing sleeps (a closed socket's access-log line, which no page event
announces, is asked for with :func:`tests.support.waiting.until`). Without Chromium (or Playwright)
the browser tests skip, saying so; ``./setup.sh --with-test-services`` installs it."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import requests

from lyre.api.common import InFlight
from lyre.api.http.app import create_app
from lyre.config import load_config
from lyre.service.tts import TTSService
from tests.support.servers import serve_in_process
from tests.support.waiting import until

CHROMIUM = shutil.which("chromium") or next((p for p in ("/usr/bin/chromium",) if os.access(p, os.X_OK)), None)
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"]
WAIT_MS = 120_000  # a bound for a stuck page, not a measurement: generous for a loaded 2-core machine
KEY = "k-playground-0123456789"
# Long enough that its audio is still being made when the cancel arrives (~40 pieces of 28 tokens
# with the test settings: seconds of generation, where the cancel takes one round trip)
LONG_TEXT = " ".join(f"This is sentence number {i} of a long text that is cancelled." for i in range(150))


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium installed: apt-get install chromium (Debian), or ./setup.sh --with-test-services")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the dev extra has it)")
    with sync_api.sync_playwright() as p:
        # (launch gives every browser a fresh, temporary user data dir; each test gets a new context)
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server():
    with serve_in_process() as srv:
        yield srv


@pytest.fixture(scope="module")
def keyed():
    with serve_in_process(f"server.api_keys={{{KEY}: ann}}") as srv:
        yield srv


class Page:
    """A page of the playground in a fresh browser context, with every URL it requested and every
    console error it printed."""

    def __init__(self, browser, url: str):
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.urls: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.page.on("websocket", lambda ws: self.urls.append(ws.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.goto(url)

    def status(self) -> dict[str, str]:
        return self.page.eval_on_selector("#status", "el => ({...el.dataset})")

    def wait_state(self, *states: str) -> dict[str, str]:
        """Wait until the page's state is one of ``states`` (or error, which fails the test, naming it)."""
        self.wait(", ".join(f'#status[data-state="{state}"]' for state in (*states, "error")))
        status = self.status()
        assert status["state"] in states, status
        return status

    def wait(self, selector: str) -> None:
        """Wait until an element matches ``selector`` (e.g. ``#status:not([data-frames="0"])``)."""
        self.page.wait_for_selector(selector, state="attached", timeout=WAIT_MS)

    def speak(self, text: str) -> None:
        self.page.fill("#text", text)
        self.page.click("#speak")

    def close(self) -> None:
        self.context.close()


@pytest.fixture()
def opened(browser):
    pages: list[Page] = []

    def open_page(url: str) -> Page:
        pages.append(Page(browser, url))
        return pages[-1]

    yield open_page
    for page in pages:
        page.close()


# --------------------------------------------------------------------------------------------
# the files (no browser)


def test_the_page_and_its_files_are_served_as_they_are_and_nothing_else(server):
    page = requests.get(server.http + "/", timeout=30)
    assert page.status_code == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"] and "/playground/playground.js" in page.text
    again = requests.get(server.http + "/", headers={"If-None-Match": page.headers["ETag"]}, timeout=30)
    assert again.status_code == 304 and not again.content
    for name, ctype in (("playground.js", "text/javascript"), ("playground.css", "text/css")):
        r = requests.get(f"{server.http}/playground/{name}", timeout=30)
        assert r.status_code == 200 and r.headers["Content-Type"] == f"{ctype}; charset=utf-8" and r.content
    for name in ("index.html", "..%2Fplayground.py", "nothing.js"):
        r = requests.get(f"{server.http}/playground/{name}", timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", name


def test_server_playground_false_serves_no_page():
    app = create_app(TTSService(load_config(None, ["server.playground=false"])), InFlight())
    assert not {r.resource.canonical for r in app.router.routes()} & {"/", "/playground/{name}"}


# --------------------------------------------------------------------------------------------
# in Chromium


def test_the_page_loads_lists_the_voices_and_speaks_over_the_websocket(server, opened):
    page = opened(server.http + "/")
    page.wait_state("ready")
    voices = page.page.eval_on_selector_all("#voice option", "options => options.map(o => o.value)")
    assert "tara" in voices and page.page.input_value("#voice") == "tara"  # the server's default voice
    page.speak("Hello from the playground.")
    done = page.wait_state("done")
    assert int(done["frames"]) > 0 and int(done["samples"]) > 0 and done["error"] == ""
    assert float(done["ttfbMs"]) > 0 and float(done["serverTtfbMs"]) > 0
    assert done["sampleRate"] == "24000"  # the AudioContext's own rate: the stream's, no resampling
    page.wait('#status:not([data-peak-level="0"]):not([data-peak-level="0.000"])')  # the meter moved: it played
    sockets = [u for u in page.urls if u.startswith("ws")]
    assert sockets == [server.http.replace("http", "ws") + "/v1/audio/stream"]
    assert not page.errors


def test_cancel_stops_the_utterance_mid_stream(server, opened):
    page = opened(server.http + "/")
    page.wait_state("ready")
    mark = server.log_mark()
    page.speak(LONG_TEXT)
    page.wait('#status:not([data-frames="0"])')
    page.page.click("#cancel")
    cancelled = page.wait_state("cancelled")
    server.eventually_idle()  # the server's session has ended: nothing more can come
    assert page.status()["frames"] == cancelled["frames"] and page.status()["playing"] == "false"
    contexts = [line for line in server.log(mark).splitlines() if "ws context" in line]
    assert len(contexts) == 1 and "status=499 code=cancelled" in contexts[0], contexts  # it had not finished
    page.speak("And again.")  # the same page speaks on
    assert int(page.wait_state("done")["frames"]) > 0
    assert not page.errors


def test_a_keyed_server_takes_a_key_once_refuses_a_bad_one_and_keeps_it_out_of_storage(keyed, opened):
    page = opened(keyed.http + "/")
    page.wait_state("key-needed")
    page.page.fill("#key", "k-not-a-key-of-this-server")
    page.page.click("#use-key")
    page.wait('#status:not([data-error=""])')
    refused = page.wait_state("key-needed")
    assert "refused this API key" in refused["error"]
    page.page.fill("#key", KEY)
    page.page.click("#use-key")
    page.wait_state("ready")
    page.speak("Spoken with a token.")
    done = page.wait_state("done")
    assert int(done["frames"]) > 0 and done["keyed"] == "true"
    held = page.page.evaluate("() => JSON.stringify([{...localStorage}, {...sessionStorage}, document.cookie, "
                              "location.href, document.getElementById('key').value])")
    assert KEY not in held and json.loads(held)[:3] == [{}, {}, ""]
    assert page.urls and not [u for u in page.urls if KEY in u or "token=" in u]  # the token went as a subprotocol
    assert all("401" in e for e in page.errors), page.errors  # (only the console's line for the refused key)
    page.page.close()  # its WebSocket closes: the socket's access-log line is written
    socket = 'route="GET /v1/audio/stream" status=101'
    until(lambda: any(socket in line and "account=ann" in line for line in keyed.log().splitlines()), 60,
          "the WebSocket's access-log line, of the key's account")
    assert KEY not in keyed.log()
