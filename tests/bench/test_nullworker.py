"""The null worker answers the gateway's calls with well-formed completions (plain and streamed), over
keep-alive connections, and 404 for anything else."""

from __future__ import annotations

import asyncio
import json

import httpx

from gateway.bench.nullworker import NullWorker


async def test_the_null_worker_answers_like_an_openai_server() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(NullWorker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
            for _ in range(3):  # one keep-alive connection
                r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
                body = r.json()
                assert r.status_code == 200 and body["object"] == "chat.completion"
                assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] > 0
            r = await c.post("/v1/completions", json={"prompt": "x"})
            assert r.json()["object"] == "text_completion" and r.json()["choices"][0]["text"]
            r = await c.post("/v1/completions", json={"prompt": "x", "stream": True})
            assert r.headers["content-type"] == "text/event-stream"
            data = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data: ")]
            assert data[-1] == "[DONE]" and [json.loads(d)["object"] for d in data[:-1]] == ["text_completion"] * 2
            assert (await c.get("/health")).status_code == 200
            assert (await c.get("/v1/models")).json()["data"][0]["id"] == "null-model"
            assert (await c.get("/metrics")).status_code == 200
            assert (await c.get("/nope")).status_code == 404
    finally:
        server.close()
        await server.wait_closed()
