"""Synthetic workflow calls with shared prompt prefixes (``shared_prefix``): what reaches the worker, what its
prefix cache serves, and the 422s for a bad segment list."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.live.routers.workflows import SYNTHETIC_VOCAB, segment_key, synthetic_prompt
from gateway.live.schemas import SharedPrefixSegment
from tests.live.harness import emulators, gateway_client, write_config
from workers.emulator import FillerResponder, GenRequest


class PromptRecorder(FillerResponder):
    """Filler answers; keeps every prompt the worker received, as token ids."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    def text(self, request: GenRequest, n_tokens: int, rng: random.Random) -> str:
        """Record the prompt, answer filler."""
        self.prompts.append([int(t) for t in request.prompt_text.split()])
        return super().text(request, n_tokens, rng)


def call(cid: str, prompt: int, shared: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"id": cid, "prompt_tokens": prompt, "max_tokens": 2, **extra}
    if shared is not None:
        c["shared_prefix"] = shared
    return c


async def _hits(url: str) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"{url}/metrics")).text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:prefix_cache_hits_total{"))


async def test_calls_naming_the_same_segments_send_the_same_leading_tokens(tmp_path: Path) -> None:
    tpl = {"name": "revise/template", "tokens": 40, "scope": "global"}
    mine = {"name": "schema+question", "tokens": 20, "scope": "workflow"}
    rec = PromptRecorder()
    async with (
        emulators(["A100"], responder=rec) as urls,
        gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _),
    ):
        # One workflow: a, then b after it (both name the template and the workflow's own segment).
        first = [call("a", 100, [tpl, mine]), call("b", 90, [tpl, mine], depends_on=["a"])]
        r = await client.post("/v1/workflows", json={"calls": first})
        assert r.status_code == 200, r.text
        assert await _hits(urls[0]) == 48  # b: 60 shared tokens, 3 whole blocks
        # Another workflow names the same segments: only the global template is shared with the first.
        r = await client.post("/v1/workflows", json={"calls": [call("a", 100, [tpl, mine])]})
        assert r.status_code == 200, r.text
        assert await _hits(urls[0]) == 48 + 32  # a: the 40-token template, 2 whole blocks
        r = await client.post("/v1/workflows", json={"calls": [call("c", 50)]})
        assert r.status_code == 200, r.text
        assert await _hits(urls[0]) == 48 + 32
    a1, b1, a2, plain = rec.prompts
    assert [len(p) for p in rec.prompts] == [100, 90, 100, 50]
    lo, hi = SYNTHETIC_VOCAB
    assert all(lo <= t < hi for p in rec.prompts for t in p)
    assert a1[:60] == b1[:60] and a1[60:70] != b1[60:70]  # the calls' own filler differs
    assert a1[:40] == a2[:40] and a1[40:60] != a2[40:60]  # scope workflow: per workflow
    assert plain[:16] != a2[:16] and plain[:16] != a1[:16]


@pytest.mark.parametrize(
    ("shared", "needle"),
    [
        ([{"name": "t", "tokens": 30}], "calls.0: Value error, shared_prefix: 30 tokens exceed prompt_tokens=20"),
        ([{"name": "t", "tokens": 15}, {"name": "u", "tokens": 6}], "21 tokens exceed prompt_tokens=20"),
        ([{"name": "", "tokens": 5}], "calls.0.shared_prefix.0.name"),
        ([{"name": "x" * 129, "tokens": 5}], "calls.0.shared_prefix.0.name"),
        ([{"name": "t", "tokens": 0}], "calls.0.shared_prefix.0.tokens"),
        ([{"name": "t", "tokens": "5"}], "calls.0.shared_prefix.0.tokens"),
        ([{"name": "t", "tokens": 1, "scope": "tenant"}], "calls.0.shared_prefix.0.scope"),
        ([{"name": "t", "tokens": 1, "extra": 1}], "calls.0.shared_prefix.0.extra"),
        ([{"name": f"s{i}", "tokens": 1} for i in range(9)], "calls.0.shared_prefix"),
        ([{"tokens": 1}], "calls.0.shared_prefix.0.name"),
        (None, "calls.0.shared_prefix: Value error, must not be null"),
        ("tpl", "calls.0.shared_prefix"),
    ],
)
async def test_a_bad_shared_prefix_is_a_422_that_names_it(tmp_path: Path, shared: Any, needle: str) -> None:
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        r = await client.post("/v1/workflows", json={"calls": [{**call("a", 20), "shared_prefix": shared}]})
        assert r.status_code == 422, r.text
        assert needle in r.json()["error"]["message"], r.json()


async def test_a_shared_prefix_on_a_chat_call_is_a_422(tmp_path: Path) -> None:
    """Chat messages carry their own text: a shared prefix means nothing there."""
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        body = {
            "id": "a",
            "messages": [{"role": "user", "content": "hi"}],
            "shared_prefix": [{"name": "t", "tokens": 1}],
        }
        r = await client.post("/v1/workflows", json={"calls": [body]})
        assert r.status_code == 422 and "shared_prefix needs prompt_tokens" in r.json()["error"]["message"], r.text


def test_synthetic_prompts_start_with_their_segments_then_their_own_filler() -> None:
    g = segment_key(SharedPrefixSegment(name="tpl", tokens=1), "wf-1")
    assert g == segment_key(SharedPrefixSegment(name="tpl", tokens=7, scope="global"), "wf-2")
    w1 = segment_key(SharedPrefixSegment(name="tpl", tokens=1, scope="workflow"), "wf-1")
    w2 = segment_key(SharedPrefixSegment(name="tpl", tokens=1, scope="workflow"), "wf-2")
    assert len({g, w1, w2}) == 3
    a = synthetic_prompt(3000, 1, [(g, 1000), (w1, 500)])
    b = synthetic_prompt(3000, 2, [(g, 1000), (w1, 500)])
    c = synthetic_prompt(3000, 1, [(g, 1000), (w2, 500)])
    assert len(a) == len(b) == len(c) == 3000
    assert a[:1500] == b[:1500] and a[1500:1516] != b[1500:1516]
    assert a[:1000] == c[:1000] and a[1000:1016] != c[1000:1016]
    assert synthetic_prompt(3000, 1, [(g, 1000), (w1, 500)]) == a  # deterministic
    # A longer segment of the same name extends the shorter one; the order of segments matters.
    assert synthetic_prompt(600, 3, [(g, 600)])[:400] == synthetic_prompt(400, 4, [(g, 400)])
    assert synthetic_prompt(100, 1, [(w1, 50), (g, 50)])[:16] != a[:16]
    # Without segments, calls share nothing (salts differ), over prompts longer than the base sequence too.
    assert len(synthetic_prompt(70_000, 5)) == 70_000
    firsts = {tuple(synthetic_prompt(16, salt)) for salt in range(2000)}
    assert len(firsts) == 2000
    with pytest.raises(ValueError, match="exceeds"):
        synthetic_prompt(10, 1, [(g, 11)])
