"""The official ``openai`` client works unchanged against the gateway's chat and text completions pass-throughs."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.live.harness import INTERACTIVE_KEY, emulators, gateway_server, write_config

GPUS = ["A100", "A6000"]


async def test_openai_client_chat_stream_and_errors(tmp_path: Path) -> None:
    async with emulators(GPUS) as urls, gateway_server(write_config(tmp_path, urls, GPUS)) as (url, app):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=INTERACTIVE_KEY, max_retries=0)
        try:
            models = await client.models.list()
            assert [m.id for m in models.data] == ["llama-3.1-70b"]

            r = await client.chat.completions.create(
                model="llama-3.1-70b",
                messages=[{"role": "user", "content": "How many singers do we have?"}],
                max_tokens=12,
            )
            assert r.choices[0].message.content is not None
            assert r.usage is not None and r.usage.completion_tokens == 12

            stream = await client.chat.completions.create(
                model="llama-3.1-70b",
                messages=[{"role": "user", "content": "List the stadiums."}],
                max_tokens=7,
                stream=True,
                stream_options={"include_usage": True},
            )
            pieces: list[str] = []
            usage = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    usage = chunk.usage
            assert len("".join(pieces).split()) == 7
            assert usage is not None and usage.completion_tokens == 7

            # A deadline from the header, and errors the client maps to its exception classes.
            r = await client.chat.completions.create(
                model="llama-3.1-70b",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=2,
                extra_headers={"x-hexflow-deadline-s": "30"},
            )
            assert r.choices[0].finish_reason == "length"
            with pytest.raises(openai.UnprocessableEntityError, match="outside tenant"):
                await client.chat.completions.create(
                    model="llama-3.1-70b",
                    messages=[{"role": "user", "content": "hi"}],
                    extra_headers={"x-hexflow-deadline-s": "1"},
                )
            with pytest.raises(openai.NotFoundError, match="does not exist"):
                await client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(openai.BadRequestError):
                # The worker rejects it (context overflow): its 400 and message come through.
                await client.chat.completions.create(
                    model="llama-3.1-70b", messages=[{"role": "user", "content": "w " * 33000}], max_tokens=5
                )
            bad = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                await bad.chat.completions.create(model="llama-3.1-70b", messages=[{"role": "user", "content": "x"}])
            await bad.close()
        finally:
            await client.close()
        gw = app.state.gateway
        assert gw.active_total == 0


async def test_openai_client_text_completions(tmp_path: Path) -> None:
    async with emulators(GPUS) as urls, gateway_server(write_config(tmp_path, urls, GPUS)) as (url, app):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=INTERACTIVE_KEY, max_retries=0)
        try:
            r = await client.completions.create(model="llama-3.1-70b", prompt="SELECT count(*) FROM", max_tokens=6)
            assert r.object == "text_completion" and r.choices[0].text
            assert r.usage is not None and r.usage.completion_tokens == 6
            r = await client.completions.create(model="llama-3.1-70b", prompt=[1, 2, 3, 4], max_tokens=3)
            assert r.usage is not None and r.usage.completion_tokens == 3
            stream = await client.completions.create(
                model="llama-3.1-70b",
                prompt="SELECT",
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            texts: list[str] = []
            usage = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    texts.append(chunk.choices[0].text)
                if chunk.usage is not None:
                    usage = chunk.usage
            assert texts and usage is not None and usage.completion_tokens == 5
            with pytest.raises(openai.UnprocessableEntityError, match="prompt"):
                await client.completions.create(model="llama-3.1-70b", prompt=["a", "b"], max_tokens=2)
            with pytest.raises(openai.NotFoundError, match="does not exist"):
                await client.completions.create(model="gpt-9", prompt="x")
        finally:
            await client.close()
        assert app.state.gateway.active_total == 0
