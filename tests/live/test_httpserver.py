"""``CoalescingTransport``: the writes of one event-loop turn reach the socket as one, in order; closing sends
what is held first, aborting drops it. And the gateway's answers over a real connection are whole."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from gateway.live.httpserver import CoalescingTransport
from tests.live.harness import INTERACTIVE_KEY, emulators, gateway_server, write_config


class Recording(asyncio.Transport):
    """A transport that records what is done to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self.events.append("write")

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


async def test_writes_of_one_turn_go_out_as_one() -> None:
    inner = Recording()
    t = CoalescingTransport(inner, asyncio.get_running_loop())
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.write(b"")  # nothing to hold
    t.writelines([b"ab", bytearray(b"cd"), memoryview(b"ef")])
    assert inner.writes == [] and t.get_write_buffer_size() == 25
    await asyncio.sleep(0)
    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nabcdef"]
    t.write(b"next turn")
    await asyncio.sleep(0)
    assert inner.writes[1:] == [b"next turn"]


async def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    inner = Recording()
    t = CoalescingTransport(inner, asyncio.get_running_loop())
    t.write(b"last bytes")
    t.close()
    assert inner.events == ["write", "close"] and inner.writes == [b"last bytes"]
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert inner.writes == [b"last bytes"]

    inner = Recording()
    t = CoalescingTransport(inner, asyncio.get_running_loop())
    t.write(b"dropped")
    t.abort()
    await asyncio.sleep(0)
    assert inner.events == ["abort"] and inner.writes == []


async def test_nothing_is_written_to_a_closing_transport() -> None:
    inner = Recording()
    t = CoalescingTransport(inner, asyncio.get_running_loop())
    t.write(b"late")
    inner.closing = True  # the connection went away meanwhile
    await asyncio.sleep(0)
    assert inner.writes == []


async def test_answers_over_a_real_connection_are_whole(tmp_path: Path) -> None:
    """Plain and streamed answers, many on one keep-alive connection, through uvicorn with the protocol."""
    async with emulators(["A100"], time_scale=0.001) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], time_scale=0.001)
        async with gateway_server(cfg) as (url, _app):
            headers = {"Authorization": f"Bearer {INTERACTIVE_KEY}"}
            body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as c:
                for i in range(20):
                    r = await c.post("/v1/chat/completions", json=body)
                    assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text
                    assert int(r.headers["content-length"]) == len(r.content)
                    r = await c.post("/v1/completions", json={"prompt": f"q{i}", "max_tokens": 3, "stream": True})
                    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                    data = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
                    assert data[-1] == "[DONE]" and all(json.loads(d)["choices"] for d in data[:-1])
                    r = await c.post("/v1/chat/completions", json={"messages": []})
                    assert r.status_code == 422 and r.json()["error"]["param"] == "messages"
