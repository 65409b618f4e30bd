"""The host CPU accounting of real-server benchmarks (``gateway.bench.hostcpu``), on a fake ``/proc``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gateway.bench import hostcpu

TICK = hostcpu._tick_s()


def write_proc(root: Path, cpus: dict[int, list[int]], procs: dict[int, tuple[int, str, int, int]]) -> None:
    """``cpus``: CPU -> ticks (user nice system idle iowait irq softirq steal); ``procs``: pid -> (pgid, comm,
    utime, stime) in ticks."""
    root.mkdir(exist_ok=True)
    for d in root.iterdir():
        if d.is_dir():
            (d / "stat").unlink()
            d.rmdir()
    total = [sum(v[i] for v in cpus.values()) for i in range(8)]
    lines = ["cpu  " + " ".join(map(str, [*total, 0, 0]))]
    lines += [f"cpu{c} " + " ".join(map(str, [*v, 0, 0])) for c, v in sorted(cpus.items())]
    lines += ["intr 1 2 3", "ctxt 99", "btime 1"]
    (root / "stat").write_text("\n".join(lines) + "\n")
    for pid, (pgid, comm, ut, st) in procs.items():
        (root / str(pid)).mkdir()
        # The command may hold spaces and parentheses: the fields are read after the last ")".
        fields = ["S", "1", str(pgid), str(pgid), "0", "-1", "0", "0", "0", "0", "0", str(ut), str(st), "0", "0"]
        (root / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")


def test_usage_splits_each_cpu_by_state_and_counts_named_groups_apart(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    write_proc(
        root,
        {0: [100, 0, 0, 100, 0, 0, 0, 0], 1: [100, 0, 0, 100, 0, 0, 0, 0]},
        {10: (10, "api server", 50, 0), 11: (10, "EngineCore (x)", 50, 0), 20: (20, "python", 10, 0)},
    )
    before = hostcpu.sample(root)
    # CPU 0: 80 busy ticks of 100 (the server pinned there used 60), 10 stolen; CPU 1: 30 busy, 70 idle.
    write_proc(
        root,
        {0: [160, 0, 10, 110, 0, 0, 10, 10], 1: [120, 0, 10, 170, 0, 0, 0, 0]},
        {
            10: (10, "api server", 60, 0),
            11: (10, "EngineCore (x)", 90, 10),  # 50 more ticks
            20: (20, "python", 15, 5),
            30: (30, "postgres", 7, 0),  # started during the interval: all its time counts
        },
    )
    after = hostcpu.sample(root)
    assert before is not None and after is not None
    object.__setattr__(after, "at", before.at + 100 * TICK)
    u = hostcpu.usage(before, after, {"a": 10, "bench": 20})
    assert u.cpus[0].busy == pytest.approx(0.8) and u.cpus[0].steal == pytest.approx(0.1)
    assert u.cpus[0].idle == pytest.approx(0.1)
    assert u.cpus[1].busy == pytest.approx(0.3) and u.cpus[1].idle == pytest.approx(0.7)
    assert u.groups == {"a": pytest.approx(60 * TICK), "bench": pytest.approx(10 * TICK)}
    assert u.cores("a") == pytest.approx(0.6)
    # 80 busy ticks on CPU 0, 60 of them the server's own: 20% of its CPU went to something else.
    assert u.beside("a", (0,)) == pytest.approx(0.2)
    assert u.steal((0,)) == pytest.approx(0.1)
    assert u.beside("a", ()) == 0.0 and u.steal((7,)) == 0.0
    assert [c for c, _ in u.others] == ["postgres"] and u.others[0][1] == pytest.approx(7 * TICK)
    doc = u.to_json()
    assert doc["cpus"]["0"]["busy"] == pytest.approx(0.8) and doc["others_cpu_s"][0]["command"] == "postgres"


def test_a_process_that_exits_or_a_reused_pid_never_counts_below_zero(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    cpus = {0: [10, 0, 0, 10, 0, 0, 0, 0]}
    write_proc(root, cpus, {10: (10, "a", 500, 0), 11: (10, "a-child", 40, 0)})
    before = hostcpu.sample(root)
    # pid 11 exited; pid 10 is now another program in another group, with less time than the old one had.
    write_proc(root, {0: [20, 0, 0, 20, 0, 0, 0, 0]}, {10: (40, "other", 3, 0)})
    after = hostcpu.sample(root)
    assert before is not None and after is not None
    u = hostcpu.usage(before, after, {"a": 10})
    assert u.groups["a"] == 0.0
    assert [c for c, _ in u.others] == ["other"] and u.others[0][1] == pytest.approx(3 * TICK)


def test_no_proc_means_no_sample(tmp_path: Path) -> None:
    assert hostcpu.sample(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "stat").write_text("intr 0\n")
    assert hostcpu.sample(tmp_path / "empty") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_this_process_is_found_in_the_real_proc() -> None:
    before = hostcpu.sample()
    x = 0
    for i in range(300_000):  # some CPU time of our own
        x += i * i
    after = hostcpu.sample()
    assert before is not None and after is not None and x > 0
    assert os.getpid() in after.procs and after.procs[os.getpid()][0] == os.getpgid(0)
    u = hostcpu.usage(before, after, {"bench": os.getpgid(0)})
    assert set(u.cpus) == set(after.cpus) and u.groups["bench"] >= 0.0
    assert all(0.0 <= s.busy <= 1.0 for s in u.cpus.values())
