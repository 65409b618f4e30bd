"""The live status page in a real browser: Debian's headless Chromium driven by Playwright.

Two kinds of tests. Against a gateway served by uvicorn in front of emulated workers: the page signs in (a
wrong key first), shows every part, watches traffic arrive without a reload, and says so over its stale
figures once the gateway stops. Against the sample state (``tests/live/status_sample.py``, the page's own
files served by Playwright's router, exact figures): the layout at 800 px and 1280 px, the bars of a call
within, past its stage budget and past the deadline, the axis ticks, an ejected worker, and a poll that gets
an error or no answer at all.

Screenshots go into each test's tmp dir, and into ``$HEXFLOW_UI_SHOTS`` when set (a folder, e.g. under the
ignored ``out/``). Skipped when ``/usr/bin/chromium`` is absent (``apt-get install chromium``), unless
``HEXFLOW_REQUIRE_CHROMIUM=1`` (CI). Playwright's own browser downloads are never used.

The screenshot in docs/img/status-page.png is the first test's: regenerate it with
``HEXFLOW_UI_SCREENSHOT=docs/img/status-page.png .venv/bin/pytest tests/live/test_status_page_browser.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.config.tenants import hash_key
from gateway.live.routers.ui import CSP, UI_DIR
from gateway.live.service import Gateway
from tests.live import status_sample
from tests.live.harness import BATCH_KEY, INTERACTIVE_KEY, chain, emulators, gateway_server, write_config

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, Route

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
SAMPLE_ORIGIN = "http://status.test"  # never resolved: Playwright's router answers every request to it
MAX_QUEUED = 40  # the browser tests' queue limit: a workflow of more calls is refused at once (429)


def _chromium_or_skip() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    if os.environ.get("HEXFLOW_REQUIRE_CHROMIUM") == "1":
        pytest.fail(f"HEXFLOW_REQUIRE_CHROMIUM=1 but {CHROMIUM} is missing (apt-get install chromium)")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")


async def _post(base: str, key: str, calls: list[dict[str, object]], deadline_s: float) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
        return await c.post("/v1/workflows", json={"calls": calls, "deadline_s": deadline_s})


async def _traffic(base: str) -> list[str]:
    """Workflows from both tenants (one at a time per tenant, both tenants at once), and one refused at
    admission: more parallel calls than the queue holds (429, counted rejected). Returns the ids the clients
    got."""
    ids: list[str] = []

    async def run(key: str, n: int, width: int, deadline_s: float) -> None:
        for _ in range(n):
            r = await _post(base, key, chain(3, width=width), deadline_s)
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])

    await asyncio.gather(run(INTERACTIVE_KEY, 3, 2, 30), run(BATCH_KEY, 2, 3, 120))
    refused = await _post(base, INTERACTIVE_KEY, chain(1, width=MAX_QUEUED + 1), 30)
    assert refused.status_code == 429, refused.text
    return ids


async def _late_traffic(base: str) -> None:
    """For the docs' screenshot only (timing-dependent, not asserted): a best-effort batch workflow that
    cannot make its deadline runs anyway and finishes late."""
    await _post(base, BATCH_KEY, chain(7, out=1500), 10)


def _keep(shot: Path) -> None:
    """Copy a screenshot into ``$HEXFLOW_UI_SHOTS`` when set."""
    where = os.environ.get("HEXFLOW_UI_SHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, Path(where) / shot.name)


@contextlib.asynccontextmanager
async def _browser() -> AsyncIterator[Browser]:
    chromium = _chromium_or_skip()
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def _page(browser: Browser, width: int, height: int, errors: list[str], *, allow: str = "401") -> Page:
    """A page that collects script errors and console errors (a Content-Security-Policy violation is one),
    except those holding ``allow`` (the 401 of a wrong key; a failed poll on purpose)."""
    page = await browser.new_page(viewport={"width": width, "height": height})
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" and allow not in msg.text else None)
    return page


async def _sign_in(page: Page, base: str) -> None:
    from playwright.async_api import expect

    await page.goto(f"{base}/ui")
    await expect(page.locator("#login")).to_be_visible(timeout=WAIT_MS)
    await page.fill("#key", ADMIN_KEY)
    await page.click("#login-button")
    await expect(page.locator("#main")).to_be_visible(timeout=WAIT_MS)


async def _serve_sample(page: Page, state: Callable[[], dict[str, Any] | None]) -> None:
    """Serve the page's own files and ``state()`` as ``/ui/api/state`` at ``SAMPLE_ORIGIN`` (None: a 503)."""
    types = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}

    async def handle(route: Route) -> None:
        path = route.request.url.removeprefix(SAMPLE_ORIGIN)
        if path == "/ui/api/state":
            body = state()
            if body is None:
                err = {"error": {"message": "the gateway is starting", "type": "unavailable"}}
                await route.fulfill(status=503, json=err)
            else:
                await route.fulfill(status=200, json=body, headers={"Cache-Control": "no-store"})
            return
        name = "index.html" if path == "/ui" else path.removeprefix("/ui/static/")
        file = UI_DIR / name
        if "/" in name or not file.is_file():
            await route.fulfill(status=404, body="not found")
            return
        headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}
        await route.fulfill(status=200, body=file.read_bytes(), content_type=types[file.suffix], headers=headers)

    await page.route(f"{SAMPLE_ORIGIN}/**", handle)


async def _sample_page(browser: Browser, width: int, errors: list[str], **kw: Any) -> Page:
    page = await _page(browser, width, 900, errors, **kw)
    await _serve_sample(page, status_sample.sample_state)
    await _sign_in(page, SAMPLE_ORIGIN)
    from playwright.async_api import expect

    await expect(page.locator("#slowest .wf")).to_have_count(3, timeout=WAIT_MS)
    return page


# ---------------------------------------------------------------- against a live gateway


async def test_status_page_signs_in_shows_everything_and_updates_live(tmp_path: Path) -> None:
    from playwright.async_api import expect

    admin = {"api_key_sha256": [hash_key(ADMIN_KEY)]}
    async with emulators(GPUS, time_scale=0.05) as urls, _browser() as browser:
        cfg = write_config(tmp_path, urls, GPUS, time_scale=0.05, admin=admin, limits={"max_queued_calls": MAX_QUEUED})
        async with gateway_server(cfg) as (base, app):
            errors: list[str] = []
            page = await _page(browser, 1360, 1000, errors)
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
            await expect(interactive.locator(".in-time")).to_have_text("–")
            await expect(page.locator("#alpha")).not_to_have_text("…")
            await expect(page.locator("#slowest")).to_contain_text("no workflow finished")
            await expect(page.locator("#stale")).to_be_hidden()

            # Traffic: the page picks it up by polling, without a reload (the marker survives).
            await page.evaluate("window.__notReloaded = true")
            polls_before = int(await page.locator("#updated").get_attribute("data-polls") or "0")
            ids = await _traffic(base)
            await expect(interactive.locator(".finished")).to_have_text("3", timeout=WAIT_MS)
            await expect(page.locator('[data-tenant="batch"] .finished')).to_have_text("2", timeout=WAIT_MS)
            # Three in time and one refused: all that finished were in time, three of four arrivals were.
            await expect(interactive.locator(".attainment")).to_have_text("100.0 %")
            await expect(interactive.locator(".in-time")).to_have_text("75.0 %")
            await expect(interactive.locator(".arrivals")).to_have_text("4")
            await expect(interactive.locator(".outcomes")).to_contain_text("rejected 1")
            await expect(interactive.locator(".goodput")).not_to_have_text("0.000 /s")
            await expect(page.locator("#slowest .wf")).to_have_count(5, timeout=WAIT_MS)
            for wf_id in ids:  # each workflow under the id its client got
                await expect(page.locator(f'#slowest .wf[data-workflow="{wf_id}"] .wf-id')).to_have_text(wf_id)
            first = page.locator("#slowest .wf").first
            await expect(first.locator("svg.timeline")).to_be_visible()
            assert await first.locator("svg.timeline g.call").count() in (6, 9)  # one bar group per call
            polls_after = int(await page.locator("#updated").get_attribute("data-polls") or "0")
            assert polls_after > polls_before
            assert await page.evaluate("window.__notReloaded === true")

            # An outlier ejection: the worker's row says why, and until when.
            gw: Gateway = app.state.gateway
            st = gw.pool.workers[1]
            gw.pool.eject(st, status_sample.EJECTED_REASON)
            row = page.locator(f'#workers tr[data-worker="{st.name}"]')
            await expect(row.locator(".badge")).to_have_text("ejected", timeout=WAIT_MS)
            await expect(row.locator(".why-reason")).to_have_text(status_sample.EJECTED_REASON)
            await expect(row.locator(".why-until")).to_contain_text("until ")
            assert errors == []

            docs_shot = os.environ.get("HEXFLOW_UI_SCREENSHOT")
            if docs_shot:
                await _late_traffic(base)
                await page.wait_for_timeout(2 * 1500)  # two polls
            shot = tmp_path / "status-page.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            _keep(shot)
            if docs_shot:
                shutil.copyfile(shot, docs_shot)

            # Signing out forgets the key.
            await page.click("#logout")
            await expect(page.locator("#login")).to_be_visible()
            await expect(page.locator("#main")).to_be_hidden()
            await expect(page.locator("#summary")).to_be_hidden()
            assert await page.evaluate("sessionStorage.length") == 0


async def test_a_stopped_gateway_is_announced_over_greyed_out_figures(tmp_path: Path) -> None:
    from playwright.async_api import expect

    admin = {"api_key_sha256": [hash_key(ADMIN_KEY)]}
    errors: list[str] = []
    async with emulators(["A100"], time_scale=0.05) as urls, _browser() as browser:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.05, admin=admin)
        page = await _page(browser, 1280, 900, errors, allow="ERR_CONNECTION_REFUSED")  # the polls, on purpose
        async with gateway_server(cfg) as (base, _):
            await _sign_in(page, base)
            await expect(page.locator("#workers tbody tr")).to_have_count(1, timeout=WAIT_MS)
            await expect(page.locator("#stale")).to_be_hidden()
            assert not await page.locator("#main").evaluate("m => m.classList.contains('stale')")
        # The gateway has stopped: within a poll or two the page says so, over the figures it still shows.
        await expect(page.locator("#stale")).to_be_visible(timeout=WAIT_MS)
        await expect(page.locator("#stale")).to_contain_text("not answering")
        await expect(page.locator("#stale-since")).to_contain_text("are not current")
        assert await page.locator("#main").evaluate("m => m.classList.contains('stale')")
        assert float(await page.locator("#main section").first.evaluate("s => getComputedStyle(s).opacity")) < 0.6
        await expect(page.locator('#workers tr[data-worker="a100-0"]')).to_be_visible()  # stale, not gone
        box = await page.locator("#stale").bounding_box()
        assert box is not None and box["y"] < 100 and box["height"] >= 40  # at the top, and not a small line
        await page.mouse.wheel(0, 600)  # it stays in view as the page scrolls
        await expect(page.locator("#stale")).to_be_in_viewport()
        shot = tmp_path / "status-page-stale.png"
        await page.screenshot(path=str(shot))
        _keep(shot)
        assert errors == []


# ---------------------------------------------------------------- against the sample state


@pytest.mark.parametrize("failure", ["error", "hang"])
async def test_an_error_answer_or_a_hanging_poll_marks_the_figures_stale(tmp_path: Path, failure: str) -> None:
    from playwright.async_api import expect

    errors: list[str] = []
    up = {"now": True}
    async with _browser() as browser:
        page = await _page(browser, 1280, 900, errors, allow="503")
        if failure == "error":
            await _serve_sample(page, lambda: status_sample.sample_state() if up["now"] else None)
        else:
            await _serve_sample(page, status_sample.sample_state)
        await _sign_in(page, SAMPLE_ORIGIN)
        await expect(page.locator("#workers tbody tr")).to_have_count(3, timeout=WAIT_MS)
        if failure == "error":
            up["now"] = False
        else:
            hung: list[Route] = []

            async def never(route: Route) -> None:  # a gateway that accepts the poll and never answers
                hung.append(route)

            await page.route(f"{SAMPLE_ORIGIN}/ui/api/state", never)
        await expect(page.locator("#stale")).to_be_visible(timeout=WAIT_MS)
        says = "HTTP 503: the gateway is starting" if failure == "error" else "did not answer within"
        await expect(page.locator("#stale-why")).to_contain_text(says, timeout=WAIT_MS)
        if failure == "error":  # it answers again: the banner goes, the figures are live
            up["now"] = True
            await expect(page.locator("#stale")).to_be_hidden(timeout=WAIT_MS)
            assert not await page.locator("#main").evaluate("m => m.classList.contains('stale')")
        assert errors == []


async def test_layout_holds_at_800_px_wide(tmp_path: Path) -> None:
    errors: list[str] = []
    async with _browser() as browser:
        for width in (800, 1280):
            page = await _sample_page(browser, width, errors)
            # A burst in progress is announced in the header with what it trades (the sample's).
            badge = page.locator("#burst")
            assert await badge.is_visible()
            assert "37 questions capped (candidates 2 -> 1;" in (await badge.text_content() or "")
            assert await page.locator("#load").text_content() == "2.41×"
            overflow = await page.evaluate(
                """() => {
                  const doc = document.documentElement;
                  const out = [];
                  if (doc.scrollWidth > doc.clientWidth) out.push(`document ${doc.scrollWidth} > ${doc.clientWidth}`);
                  for (const node of document.querySelectorAll("main *, header *")) {
                    const r = node.getBoundingClientRect();
                    if (r.width > 0 && r.right > doc.clientWidth + 0.5) out.push(`${node.tagName}.${node.className}`);
                  }
                  for (const node of document.querySelectorAll(".table-wrap, .card, .tenant, .wf")) {
                    if (node.scrollWidth > node.clientWidth + 1) out.push(`cut: ${node.className}`);
                  }
                  return out;
                }"""
            )
            assert overflow == [], (width, overflow)
            shot = tmp_path / f"status-page-{width}.png"
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            _keep(shot)
            await page.close()
    assert errors == []


async def test_a_call_within_its_stage_budget_is_never_red(tmp_path: Path) -> None:
    errors: list[str] = []
    async with _browser() as browser:
        page = await _sample_page(browser, 1280, errors)
        segments = await page.evaluate(
            """() => [
              hexflowUi.callSegments({ready_s: 0.2, sent_s: 0.3, done_s: 0.5, budget_s: 0.9}, 30),
              hexflowUi.callSegments({ready_s: 0, sent_s: 0.5, done_s: 2.0, budget_s: 1.0}, 30),
              hexflowUi.callSegments({ready_s: 3, sent_s: null, done_s: 5, budget_s: 0.5}, 4),
            ]"""
        )
        within, over, late = ([(s["phase"], s["level"], s["from"], s["to"]) for s in segs] for segs in segments)
        assert within == [("wait", "ok", 0.2, 0.3), ("run", "ok", 0.3, 0.5)]
        assert over == [("wait", "ok", 0.0, 0.5), ("run", "ok", 0.5, 1.0), ("run", "over", 1.0, 2.0)]
        assert late == [("wait", "ok", 3, 3.5), ("wait", "over", 3.5, 4), ("wait", "late", 4, 5)]

        async def fills(wf_id: str) -> list[tuple[str, str]]:
            return [
                (cls, fill)
                for cls, fill in await page.locator(f'.wf[data-workflow="{wf_id}"] rect.seg').evaluate_all(
                    "rs => rs.map(r => [r.getAttribute('class'), getComputedStyle(r).fill])"
                )
            ]

        red, amber, blue = "rgb(192, 38, 45)", "rgb(247, 144, 9)", "rgb(47, 111, 219)"
        # In time at 8 % of its deadline, every call within its budget: blue runs, nothing amber or red.
        healthy = await fills(status_sample.HEALTHY_ID)
        assert {c for c, _ in healthy} <= {"seg wait-ok", "seg run-ok"}
        assert [f for c, f in healthy if c == "seg run-ok"] == [blue] * len(status_sample.HEALTHY_CALLS)
        # In time, one call past its stage budget: amber for the part past it, still no red.
        in_time = await fills(status_sample.OVER_ID)
        assert ("seg run-over", amber) in in_time and red not in {f for _, f in in_time}
        # Late: red only for what ran past the deadline; the failed call in its own colour.
        late_fills = await fills(status_sample.LATE_ID)
        assert ("seg run-late", red) in late_fills and ("seg run-failed", "rgb(122, 39, 26)") in late_fills
        assert ("seg run-ok", blue) in late_fills
        # Each call's stage budget is drawn as a band from its queueing; its end is marked where the axis reaches
        # (the third call's budget ends past the 6 s deadline, beyond the axis).
        over_wf = page.locator(f'.wf[data-workflow="{status_sample.OVER_ID}"]')
        assert await over_wf.locator("rect.budget-band").count() == len(status_sample.OVER_CALLS)
        assert await over_wf.locator("line.budget-end").count() == len(status_sample.OVER_CALLS) - 1
        # A call queued after the deadline had a negative budget: no band, all of it past the deadline.
        late_wf = page.locator(f'.wf[data-workflow="{status_sample.LATE_ID}"]')
        assert await late_wf.locator("rect.budget-band").count() == len(status_sample.LATE_CALLS) - 1
        shot = tmp_path / "status-page-budgets.png"
        await page.locator("#slowest").screenshot(path=str(shot))
        _keep(shot)
    assert errors == []


TICKS = [  # (axis span, its ticks at about five intervals)
    (0.137, [0, 0.05, 0.1, 0.15]),
    (12.058, [0, 5, 10, 15]),
    (30, [0, 10, 20, 30]),
    (1, [0, 0.2, 0.4, 0.6, 0.8, 1]),
    (0.0093, [0, 0.002, 0.004, 0.006, 0.008, 0.01]),
    (2400, [0, 500, 1000, 1500, 2000, 2500]),
    (0, [0, 1]),
]


def _round(step: float) -> bool:
    """Whether ``step`` is 1, 2 or 5 times a power of ten."""
    mag = 10 ** math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(step, m * mag, rel_tol=1e-9) for m in (1, 2, 5))


async def test_axis_ticks_are_round_numbers() -> None:
    errors: list[str] = []
    async with _browser() as browser:
        page = await _sample_page(browser, 1280, errors)
        got = await page.evaluate("spans => spans.map(s => hexflowUi.niceTicks(s, 5))", [s for s, _ in TICKS])
        ticks_of = "ss => ss.map(s => [...s.querySelectorAll('text.tick')].map(t => [+t.dataset.tick, t.textContent]))"
        timelines = await page.locator("svg.timeline").evaluate_all(ticks_of)
        sparks = await page.locator("svg.spark").evaluate_all(ticks_of)
    assert got == [t for _, t in TICKS]
    assert len(timelines) == 3 and len(sparks) == 2
    for ticks in timelines:  # 0, then equal round steps, each labelled with its value
        values = [v for v, _ in ticks]
        steps = {round(b - a, 9) for a, b in itertools.pairwise(values)}
        assert values[0] == 0 and len(steps) == 1 and _round(steps.pop()), values
        assert all(float(label.removesuffix(" s")) == pytest.approx(v) for v, label in ticks), ticks
    for [(top, label)] in sparks:  # the top of a sparkline: one or two round steps
        assert _round(top) or _round(top / 2), top
        assert float(label.removesuffix(" /s")) == pytest.approx(top)
    assert errors == []
