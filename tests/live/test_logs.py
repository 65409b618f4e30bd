"""Log lines: normal events are INFO, JSON lines carry the request and workflow ids, ``X-Request-Id`` is kept
or made, and the format is chosen by flag, environment or config."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.live.logs import REQUEST_ID, WORKFLOW_ID, configure_logging
from gateway.live.server import LOG_FORMAT_ENV, _env_log_format
from tests.live.harness import chain, emulators, gateway_client, write_config


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """The root logger writing JSON lines at DEBUG into a buffer (the handler is removed after)."""
    root = logging.getLogger()
    level = root.level
    buf = io.StringIO()
    handler = configure_logging("debug", "json", stream=buf)
    try:
        yield buf
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_a_json_line_carries_the_ids_of_its_context(json_logs: io.StringIO) -> None:
    log = logging.getLogger("hexflow.test")
    log.info("outside")
    r, w = REQUEST_ID.set("req-1"), WORKFLOW_ID.set("wf-1")
    try:
        log.warning("inside %s", "x\ud800")  # a lone surrogate is escaped, not raised
    finally:
        WORKFLOW_ID.reset(w)
        REQUEST_ID.reset(r)
    outside, inside = _lines(json_logs)
    assert outside["message"] == "outside" and "request_id" not in outside and "workflow_id" not in outside
    assert inside["level"] == "WARNING" and inside["logger"] == "hexflow.test"
    assert inside["request_id"] == "req-1" and inside["workflow_id"] == "wf-1"
    assert str(inside["ts"]).endswith("Z")


async def test_a_workflow_logs_with_its_request_and_workflow_ids(json_logs: io.StringIO, tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        r = await client.post("/v1/workflows", json={"calls": chain(2)}, headers={"X-Request-Id": "client-id-7"})
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "client-id-7"
        wf_id = r.json()["id"]
        r2 = await client.post("/v1/workflows", json={"calls": chain(1)}, headers={"X-Request-Id": "bad id\n"})
        assert r2.headers["x-request-id"].startswith("req-")  # an id unfit for logs is replaced
    ended = [line for line in _lines(json_logs) if str(line["message"]).startswith("workflow of tenant")]
    assert ended and ended[0]["request_id"] == "client-id-7" and ended[0]["workflow_id"] == wf_id
    assert len({line.get("request_id") for line in ended}) == 2


@pytest.mark.parametrize(("value", "expected"), [("", None), ("json", "json"), (" TEXT ", "text")])
def test_the_environment_chooses_the_log_format(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str | None
) -> None:
    monkeypatch.setenv(LOG_FORMAT_ENV, value)
    assert _env_log_format() == expected


def test_an_unknown_log_format_in_the_environment_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOG_FORMAT_ENV, "yaml")
    with pytest.raises(ConfigError, match="expected text or json"):
        _env_log_format()
