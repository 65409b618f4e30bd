"""The gateway's HTTP API against in-process emulated workers: results, timings, and every error code."""

from __future__ import annotations

from pathlib import Path

from tests.live.harness import chain, emulators, gateway_client, write_config

GPUS = ["A100", "L40S"]


async def test_workflow_runs_every_call_in_dependency_order(tmp_path: Path) -> None:
    async with emulators(GPUS) as urls, gateway_client(write_config(tmp_path, urls, GPUS)) as (client, _):
        r = await client.post("/v1/workflows", json={"calls": chain(3, width=2), "deadline_s": 60})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ok" and body["deadline_met"]
        assert [c["id"] for c in body["calls"]] == ["s0c0", "s0c1", "s1c0", "s1c1", "s2c0", "s2c1"]
        for c in body["calls"]:
            assert c["completion_tokens"] == 10 and c["prompt_tokens"] == 200
            assert c["worker"] in ("a100-0", "l40s-1")
            assert c["output"] is not None and len(c["output"].split()) == 10
        status = (await client.get("/v1/status")).json()
        assert status["policy"] == "hexgen" and len(status["workers"]) == 2
        assert sum(w["completed"] for w in status["workers"]) == 6


async def test_benchmark_only_fields_are_refused_out_of_benchmark_mode(tmp_path: Path) -> None:
    """``prompt_tokens``, ``shared_prefix`` and ``ignore_eos`` build synthetic prompts for the benchmarks: a
    gateway without ``benchmark: true`` answers 422 naming the field and the switch, and runs chat calls."""
    chat = {"id": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    synthetic = {"id": "a", "prompt_tokens": 10, "max_tokens": 2}
    segment = {"name": "t", "tokens": 4}
    async with (
        emulators(["A100"]) as urls,
        gateway_client(write_config(tmp_path, urls, ["A100"], benchmark=False)) as (client, _),
    ):
        for call, field in (
            (synthetic, "prompt_tokens"),
            ({**synthetic, "shared_prefix": [segment]}, "prompt_tokens"),
            ({**chat, "ignore_eos": True}, "ignore_eos"),
        ):
            r = await client.post("/v1/workflows", json={"calls": [call]})
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["param"] == f"calls.0.{field}" and "benchmark: true" in err["message"], err
        r = await client.post("/v1/workflows", json={"calls": [chat]})
        assert r.status_code == 200, r.text


async def test_bad_input_gets_a_4xx_that_names_the_problem(tmp_path: Path) -> None:
    async with emulators(["A100"]) as urls:
        cfg = write_config(tmp_path, urls, ["A100"], limits={"max_body_bytes": 4096})
        async with gateway_client(cfg) as (client, _):
            ok_call = {"id": "a", "prompt_tokens": 10, "max_tokens": 2}
            cases: list[tuple[dict[str, object] | bytes, int, str]] = [
                (b"{not json", 422, "request body is not valid JSON"),
                ({"calls": []}, 422, "calls"),
                ({"calls": [{"id": "a", "max_tokens": 2}]}, 422, "exactly one of messages and prompt_tokens"),
                ({"calls": [{**ok_call, "max_tokens": 0}]}, 422, "calls.0.max_tokens"),
                ({"calls": [ok_call], "bogus": 1}, 422, "bogus"),
                ({"calls": [ok_call, {**ok_call}]}, 422, "duplicate call id 'a'"),
                ({"calls": [{**ok_call, "depends_on": ["zz"]}]}, 422, "unknown call 'zz'"),
                (
                    {"calls": [{**ok_call, "depends_on": ["b"]}, {**ok_call, "id": "b", "depends_on": ["a"]}]},
                    422,
                    "cycle",
                ),
                ({"calls": [ok_call], "deadline_s": 1.0}, 422, "outside tenant interactive's range [5, 600]"),
                ({"calls": [ok_call], "deadline_s": 10_000}, 422, "outside tenant"),
                ({"calls": [{**ok_call, "prompt_tokens": 10**6}]}, 422, "calls.0.prompt_tokens"),
                ({"calls": [ok_call] * 1, "template": "nope"}, 422, "template"),
                ({"calls": [{**ok_call, "kind": "bad kind!"}]}, 422, "calls.0.kind"),
                ({"calls": [ok_call], "pad": "x" * 5000}, 413, "exceeds the limit of 4096 bytes"),
            ]
            for body, status, needle in cases:
                if isinstance(body, bytes):
                    r = await client.post("/v1/workflows", content=body, headers={"content-type": "application/json"})
                else:
                    r = await client.post("/v1/workflows", json=body)
                assert r.status_code == status, (body, r.text)
                err = r.json()["error"]
                assert needle in err["message"], (needle, err)
            r = await client.post("/v1/workflows", json={"calls": [ok_call]}, headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401 and "unknown API key" in r.json()["error"]["message"]
            r = await client.post("/v1/workflows", json={"calls": [ok_call]}, headers={"Authorization": ""})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            # Nothing above reached a worker, and the gateway still works.
            r = await client.post("/v1/workflows", json={"calls": [ok_call]})
            assert r.status_code == 200, r.text


async def test_a_body_that_is_not_json_is_named_so_by_line_and_column_and_content_type(tmp_path: Path) -> None:
    """Malformed JSON: 422 saying where (line and column, not a byte offset as ``param``); a body sent with
    another content type (curl's default form encoding): 415 saying to send ``Content-Type: application/json``."""
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        for route in ("/v1/workflows", "/v1/chat/completions"):
            r = await client.post(
                route, content=b'{"calls": [\n  {"id": x}]}', headers={"content-type": "application/json"}
            )
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert (
                err["message"].startswith("request body is not valid JSON: ") and "line 2 column 10" in err["message"]
            )
            assert err["param"] == "body"
            r = await client.post(
                route, content=b'{"calls": []}', headers={"content-type": "application/x-www-form-urlencoded"}
            )
            assert r.status_code == 415, r.text
            err = r.json()["error"]
            assert "Content-Type: application/json" in err["message"] and "x-www-form-urlencoded" in err["message"]
            assert err["param"] == "body"
            r = await client.post(route, content=b'{"calls": []}', headers={"content-type": "text/plain"})
            assert r.status_code == 415 and "text/plain" in r.json()["error"]["message"]


async def test_types_are_strict_never_coerced(tmp_path: Path) -> None:
    """A JSON value of the wrong type is a 422 naming the field, on every route; an integral number is an
    integer (JSON Schema's rule), and a header that is empty counts as absent."""
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        msgs = [{"role": "user", "content": "hi"}]
        call = {"id": "a", "prompt_tokens": 10, "max_tokens": 2}
        cases: list[tuple[str, dict[str, object], str]] = [
            ("/v1/chat/completions", {"messages": msgs, "stream": "yes"}, "stream"),
            ("/v1/chat/completions", {"messages": msgs, "max_tokens": "5"}, "max_tokens"),
            ("/v1/chat/completions", {"messages": msgs, "max_tokens": True}, "max_tokens"),
            ("/v1/chat/completions", {"messages": msgs, "temperature": "0.5"}, "temperature"),
            ("/v1/chat/completions", {"messages": msgs, "n": 2}, "n"),
            ("/v1/chat/completions", {"messages": [{"role": 1, "content": "hi"}]}, "messages.0.role"),
            ("/v1/workflows", {"calls": [call], "deadline_s": True}, "deadline_s"),
            ("/v1/workflows", {"calls": [call], "return_outputs": "false"}, "return_outputs"),
            ("/v1/workflows", {"calls": [{**call, "max_tokens": 2.5}]}, "calls.0.max_tokens"),
            ("/v1/workflows", {"calls": [{**call, "ignore_eos": 1}]}, "calls.0.ignore_eos"),
            ("/v1/workflows", {"calls": [{**call, "messages": msgs}]}, "exactly one of messages and prompt_tokens"),
            ("/v1/workflows", {"calls": [{**call, "messages": None}]}, "calls.0.messages"),
            ("/v1/text2sql", {"question": "q?", "db_id": "x", "stream": "yes"}, "stream"),
            ("/v1/text2sql", {"question": "q?", "db_id": "x", "deadline_s": True}, "deadline_s"),
        ]
        for path, body, needle in cases:
            r = await client.post(path, json=body)
            assert r.status_code == 422, (path, body, r.text)
            assert needle in r.json()["error"]["message"], (needle, r.json())
        r = await client.post("/v1/workflows", json={"calls": [{**call, "max_tokens": 2.0}], "deadline_s": 30})
        assert r.status_code == 200, r.text
        for value in ("", "30"):
            r = await client.post(
                "/v1/chat/completions",
                json={"messages": msgs, "max_tokens": 2},
                headers={"x-hexflow-deadline-s": value},
            )
            assert r.status_code == 200, (value, r.text)
        for value in ("soon", "1_0", "inf", "nan", " 30", "1e400"):
            r = await client.post(
                "/v1/chat/completions", json={"messages": msgs}, headers={"x-hexflow-deadline-s": value}
            )
            assert r.status_code == 422 and "x-hexflow-deadline-s" in r.json()["error"]["message"], (value, r.text)


async def test_chat_passes_fields_it_does_not_know_to_the_worker(tmp_path: Path) -> None:
    """OpenAI clients send fields the gateway does not declare: they reach the worker as sent (the
    emulated worker refuses a negative ``min_tokens``, and its refusal comes back), and a null in a field
    the gateway declares means its default."""
    async with emulators(["A100"]) as urls, gateway_client(write_config(tmp_path, urls, ["A100"])) as (client, _):
        msgs = [{"role": "user", "content": "hi", "name": "alice"}]
        r = await client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, "min_tokens": -1})
        assert r.status_code == 400 and "min_tokens" in r.json()["error"]["message"], r.text
        r = await client.post(
            "/v1/chat/completions",
            json={"messages": msgs, "max_tokens": 3, "n": None, "stop": None, "logit_bias": {}, "extra_x": [1]},
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
