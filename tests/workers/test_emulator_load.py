"""One emulator process serves 256 concurrent streaming requests, every one to the end, none lost.

The machine-dependent figures of the same load (event-loop lag, model CPU per iteration) are printed here;
no test bounds them, since a busy machine moves them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.bench.emulator_load import MODEL, format_report, run_load
from tests.emulator_process import emulator_process

STREAMS = 256
MAX_TOKENS = 200


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[str]:
    args = ["--gpu", "A100", "--model", MODEL, "--time-scale", "0.05", "--max-num-seqs", str(STREAMS)]
    with emulator_process(args, tmp_path / "emulator.log") as url:
        yield url


def test_256_concurrent_streams_all_complete_and_none_is_lost(emulator: str) -> None:
    rep = asyncio.run(run_load(emulator, streams=STREAMS, max_tokens=MAX_TOKENS))
    assert [s.status for s in rep.streams] == [200] * STREAMS
    assert all(s.done for s in rep.streams), "a stream ended without data: [DONE]"
    assert [s.completion_tokens for s in rep.streams] == [MAX_TOKENS] * STREAMS
    # Tokens arrive as they are produced, in several chunks, not in one piece at the end.
    assert all(s.chunks >= 4 for s in rep.streams)
    assert rep.complete == STREAMS
    # The worker counted every request and token it served, and batched them over many engine iterations.
    assert rep.requests_succeeded == STREAMS
    assert rep.generation_tokens == STREAMS * MAX_TOKENS
    assert rep.model_iterations > 200
    print("\n" + format_report(rep))
