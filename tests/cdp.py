"""Drive the system's Chromium through the DevTools protocol, as a person uses a page.

:func:`start_browser` runs Debian's ``chromium`` headless with ``--remote-debugging-port``
(a :class:`~estream.devcluster.process.ManagedProcess`: stopped by PID, under the
session's safety net); :class:`Page` is one tab over a websocket (aiohttp): navigate,
evaluate JavaScript, wait for a condition (bounded), click with the mouse at an element's
centre, type text with the keyboard, take a PNG screenshot. No downloaded browser, no
Playwright: a dozen DevTools commands are all the tests need.

Side effects: a browser process, loopback HTTP and websocket traffic.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import aiohttp

from estream.devcluster.process import ManagedProcess, free_port, stop_processes

command_timeout_s: Final = 30.0
wait_step_s: Final = 0.1
FLAGS: Final = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--hide-scrollbars")


class BrowserError(AssertionError):
    """A DevTools command failed, or JavaScript in the page threw."""


@asynccontextmanager
async def start_browser(executable: str, profile: Path, width: int = 1280,
                        height: int = 1600) -> AsyncIterator[Page]:
    """A headless Chromium and one page (tab) of it; the browser is stopped on leaving."""
    port = free_port()
    proc = ManagedProcess(
        [executable, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
         f"--remote-debugging-port={port}", "--remote-debugging-address=127.0.0.1",
         "about:blank"], profile.with_suffix(".log"), name="chromium").start()
    try:
        proc.wait_listening(f"127.0.0.1:{port}", timeout_s=60.0)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                tabs = await response.json()
            url = next(t["webSocketDebuggerUrl"] for t in tabs if t.get("type") == "page")
            async with http.ws_connect(url, max_msg_size=64 * 1024 * 1024) as ws:
                page = Page(ws)
                await page.send("Page.enable")
                await page.send("Emulation.setDeviceMetricsOverride", width=width,
                                height=height, deviceScaleFactor=1, mobile=False)
                yield page
    finally:
        stop_processes([proc])


class Page:
    """One tab: commands are sent and their answers awaited in order (events skipped)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        await self.ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        async with asyncio.timeout(command_timeout_s):
            while True:
                message = await self.ws.receive()
                if message.type != aiohttp.WSMsgType.TEXT:
                    raise BrowserError(f"DevTools connection ended: {message.type}")
                body = json.loads(message.data)
                if body.get("id") != ident:
                    continue  # an event
                if "error" in body:
                    raise BrowserError(f"{method}: {body['error']}")
                result: dict[str, Any] = body.get("result", {})
                return result

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait("document.readyState === 'complete'", f"{url} loaded")

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` (awaited when a promise), JSON-serialisable."""
        result = await self.send("Runtime.evaluate", expression=expression,
                                 awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def wait(self, expression: str, what: str, timeout_s: float = 20.0) -> Any:
        """Evaluate ``expression`` until it is truthy (returned), bounded in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise BrowserError(f"{what}: not within {timeout_s:g}s "
                                   f"(page says: {await self.text('#message')!r}, "
                                   f"{await self.text('#status')!r})")
            await asyncio.sleep(wait_step_s)

    async def text(self, selector: str) -> str:
        value = await self.evaluate(
            f"(document.querySelector({json.dumps(selector)}) || {{}}).innerText || ''")
        return str(value)

    async def click(self, selector: str) -> None:
        """A mouse click at the centre of the element (scrolled into view first)."""
        box = await self.wait(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect(); if (!r.width) return null;"
            " const x = r.x + r.width / 2, y = r.y + r.height / 2;"
            " const hit = document.elementFromPoint(x, y);"  # not covered, not moving away
            " return hit && (hit === e || e.contains(hit)) ? [x, y] : null; })()",
            f"{selector} on the page")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                            clickCount=1)

    async def type(self, selector: str, text: str) -> None:
        """Clear the field, then type ``text`` into it with the keyboard."""
        await self.click(selector)
        await self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                            " e.focus(); e.value = ''; })()")
        await self.send("Input.insertText", text=text)

    async def choose(self, selector: str, value: str) -> None:
        """Pick an option of a ``<select>`` (as a keyboard user would), firing change."""
        await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            f" e.value = {json.dumps(value)};"
            " e.dispatchEvent(new Event('change')); })()")

    async def screenshot(self) -> bytes:
        result = await self.send("Page.captureScreenshot", format="png")
        return base64.b64decode(result["data"])
