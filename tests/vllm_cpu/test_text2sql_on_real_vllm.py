"""``/v1/text2sql`` against the real vLLM server on the CPU (tiny random-weight model).

The model's output is garbage, so no SQL survives extraction and checking: the pipeline must end with
``no_valid_sql`` within the deadline, with every stage of its workflow accounted for, and nothing may
crash or hang.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import CONFIG_DIR
from gateway.text2sql.demo import DB_ID, demo_questions, write_sqlite
from tests.live.harness import BATCH_KEY, gateway_client
from workers.cpu_vllm import SERVED_MODEL_NAME

pytestmark = pytest.mark.vllm_cpu


def _config(tmp: Path, url: str) -> Path:
    # Tenants admitted by their concurrency bounds only: the profile is a GPU stand-in for a CPU server, so
    # until the estimator has learned the real speed its completion predictions would refuse the tests'
    # deliberately queued work (deadline-based admission has its own tests on emulated workers).
    tenants = yaml.safe_load((CONFIG_DIR / "tenants.yaml").read_text())
    for t in tenants["tenants"]:
        t["predictive_admission"] = False
    (tmp / "tenants.yaml").write_text(yaml.safe_dump(tenants))
    db = write_sqlite(tmp / f"{DB_ID}.sqlite")
    (tmp / "databases.yaml").write_text(yaml.safe_dump({"databases": {DB_ID: {"url": f"sqlite:///{db.name}"}}}))
    cfg: dict[str, Any] = {
        "policy": "hexgen",
        "tenants_file": "tenants.yaml",
        "databases_file": "databases.yaml",
        # A short schema and two revision rounds keep every prompt well inside the test server's context and
        # the run short on a CPU.
        "text2sql": {"candidates": 2, "max_revisions": 2, "schema_max_chars": 2500},
        "cluster": {
            "name": "cpu",
            "model": "llama-3.1-8b",
            "workers": [{"name": "cpu-0", "gpu": "L4", "url": url, "capacity": 2, "served_model": SERVED_MODEL_NAME}],
        },
        "tuning": {"enabled": False},
        "shutdown_grace_s": 10,
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def test_garbage_model_gives_no_valid_sql_within_the_deadline(tmp_path: Path, vllm_url: str) -> None:
    async with gateway_client(_config(tmp_path, vllm_url), key=BATCH_KEY) as (client, app):
        q = demo_questions()[0]
        r = await client.post("/v1/text2sql", json={"question": q.question, "db_id": DB_ID, "deadline_s": 300})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["status"] == "no_valid_sql", out
        assert out["latency_s"] <= out["deadline_s"]
        kinds = [s["kind"] for s in out["stages"]]
        # keywords, schema linking, 2 candidates, then at most 2 revise rounds of 2 calls each.
        assert kinds[:4] == ["extract_keywords", "information_retriever", "generate_candidate", "generate_candidate"]
        assert set(kinds[4:]) <= {"revise"} and len(kinds[4:]) == out["revisions"] <= 4
        assert all(s["worker"] == "cpu-0" and s["run_s"] > 0 and "error" not in s for s in out["stages"])
        assert all(not c["valid"] and c["problem"] for c in out["candidates"])
        assert app.state.gateway.active_total == 0
