"""The live status page in a real browser: Debian's headless Chromium driven by Playwright, against a gateway
served by uvicorn in front of emulated workers.

The test signs in (a wrong key first), checks that every part of the page is visible, sends traffic and
watches the page update without a reload, and takes screenshots into its tmp dir. Skipped when
``/usr/bin/chromium`` is absent (``apt-get install chromium``), unless ``HEXFLOW_REQUIRE_CHROMIUM=1`` (CI).
Playwright's own browser downloads are never used.

The screenshot in docs/img/status-page.png is this test's: regenerate it with
``HEXFLOW_UI_SCREENSHOT=docs/img/status-page.png .venv/bin/pytest tests/live/test_status_page_browser.py``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import httpx
import pytest

from gateway.config.tenants import hash_key
from tests.live.harness import BATCH_KEY, INTERACTIVE_KEY, chain, emulators, gateway_server, write_config

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADMIN_KEY = "ops-browser-key"
GPUS = ["A100", "A100", "L40S"]
WAIT_MS = 30_000  # generous: a busy two-core machine


def _chromium_or_skip() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    if os.environ.get("HEXFLOW_REQUIRE_CHROMIUM") == "1":
        pytest.fail(f"HEXFLOW_REQUIRE_CHROMIUM=1 but {CHROMIUM} is missing (apt-get install chromium)")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")


async def _post(base: str, key: str, calls: list[dict[str, object]], deadline_s: float) -> int:
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
        r = await c.post("/v1/workflows", json={"calls": calls, "deadline_s": deadline_s})
        return r.status_code


async def _traffic(base: str) -> None:
    """Workflows from both tenants (one at a time per tenant, both tenants at once), and one refused at
    admission: five long calls in a row (about 11 s on idle workers at this time scale, twice the deadline)
    cannot make a 5 s deadline (429, counted rejected)."""

    async def run(key: str, n: int, width: int, deadline_s: float) -> None:
        for _ in range(n):
            assert await _post(base, key, chain(3, width=width), deadline_s) == 200

    await asyncio.gather(run(INTERACTIVE_KEY, 3, 2, 30), run(BATCH_KEY, 2, 3, 120))
    assert await _post(base, INTERACTIVE_KEY, chain(5, out=2000), 5) == 429


async def _late_traffic(base: str) -> None:
    """For the docs' screenshot only (timing-dependent, not asserted): a best-effort batch workflow that
    cannot make its deadline runs anyway and finishes late."""
    await _post(base, BATCH_KEY, chain(7, out=1500), 10)


async def test_status_page_signs_in_shows_everything_and_updates_live(tmp_path: Path) -> None:
    chromium = _chromium_or_skip()
    from playwright.async_api import async_playwright, expect

    admin = {"api_key_sha256": [hash_key(ADMIN_KEY)]}
    async with emulators(GPUS, time_scale=0.05) as urls:
        cfg = write_config(tmp_path, urls, GPUS, time_scale=0.05, admin=admin)
        async with gateway_server(cfg) as (base, _), async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page(viewport={"width": 1360, "height": 1000})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                # Console errors too (a Content-Security-Policy violation is one), except the 401 of the wrong key.
                page.on(
                    "console",
                    lambda msg: errors.append(msg.text) if msg.type == "error" and "401" not in msg.text else None,
                )
                await page.goto(f"{base}/ui")

                # Signed out: the form; a wrong key is refused with the gateway's message.
                await expect(page.locator("#login")).to_be_visible(timeout=WAIT_MS)
                await expect(page.locator("#main")).to_be_hidden()
                await expect(page.locator("#summary")).to_be_hidden()
                await page.fill("#key", INTERACTIVE_KEY)  # a tenant's key is not an admin key
                await page.click("#login-button")
                await expect(page.locator("#login-error")).to_contain_text("not an admin key", timeout=WAIT_MS)
                await page.screenshot(path=str(tmp_path / "status-page-login.png"))

                await page.fill("#key", ADMIN_KEY)
                await page.click("#login-button")
                await expect(page.locator("#main")).to_be_visible(timeout=WAIT_MS)
                await expect(page.locator("#workers tbody tr")).to_have_count(3, timeout=WAIT_MS)
                for name, gpu in (("a100-0", "A100"), ("a100-1", "A100"), ("l40s-2", "L40S")):
                    row = page.locator(f'#workers tr[data-worker="{name}"]')
                    await expect(row).to_be_visible()
                    await expect(row).to_contain_text(gpu)
                    await expect(row.locator(".badge")).to_have_text("up")
                interactive = page.locator('[data-tenant="interactive"]')
                await expect(interactive).to_be_visible()
                await expect(page.locator('[data-tenant="batch"]')).to_be_visible()
                await expect(interactive.locator(".finished")).to_have_text("0")
                await expect(interactive.locator(".attainment")).to_have_text("–")
                await expect(page.locator("#alpha")).not_to_have_text("…")
                await expect(page.locator("#slowest")).to_contain_text("no workflow finished")

                # Traffic: the page picks it up by polling, without a reload (the marker survives).
                await page.evaluate("window.__notReloaded = true")
                polls_before = int(await page.locator("#updated").get_attribute("data-polls") or "0")
                await _traffic(base)
                await expect(interactive.locator(".finished")).to_have_text("3", timeout=WAIT_MS)
                await expect(page.locator('[data-tenant="batch"] .finished')).to_have_text("2", timeout=WAIT_MS)
                await expect(interactive.locator(".attainment")).to_have_text("100.0 %")
                await expect(interactive.locator(".outcomes")).to_contain_text("rejected 1")
                await expect(interactive.locator(".goodput")).not_to_have_text("0.000 /s")
                await expect(page.locator("#slowest .wf")).to_have_count(5, timeout=WAIT_MS)
                first = page.locator("#slowest .wf").first
                await expect(first.locator("svg.timeline")).to_be_visible()
                assert await first.locator("svg.timeline g").count() in (6, 9)  # one bar group per call
                polls_after = int(await page.locator("#updated").get_attribute("data-polls") or "0")
                assert polls_after > polls_before
                assert await page.evaluate("window.__notReloaded === true")
                assert errors == []

                docs_shot = os.environ.get("HEXFLOW_UI_SCREENSHOT")
                if docs_shot:
                    await _late_traffic(base)
                    await page.wait_for_timeout(2 * 1500)  # two polls
                shot = tmp_path / "status-page.png"
                await page.screenshot(path=str(shot), full_page=True)
                assert shot.stat().st_size > 10_000
                if docs_shot:
                    shutil.copyfile(shot, docs_shot)

                # Signing out forgets the key.
                await page.click("#logout")
                await expect(page.locator("#login")).to_be_visible()
                await expect(page.locator("#main")).to_be_hidden()
                await expect(page.locator("#summary")).to_be_hidden()
                assert await page.evaluate("sessionStorage.length") == 0
            finally:
                await browser.close()
