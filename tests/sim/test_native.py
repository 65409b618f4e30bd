"""The native build (setup.py, ``make native``): what it compiles, and that a native run really ran compiled code.

``make test-native`` runs tests/sim and tests/core against the compiled modules with ``HEXFLOW_EXPECT_NATIVE=1``;
there, ``test_listed_modules_are_compiled`` fails if any module setup.py lists was imported from its source
(a build that silently fell back to Python would otherwise pass every other test without testing the build).
"""

from __future__ import annotations

import ast
import importlib
import os
import pickle
import random
from pathlib import Path

import pytest

from gateway.bench.simspeed import NATIVE_PROBES, build_kind

SETUP_PY = Path(__file__).resolve().parents[2] / "setup.py"


def _listed() -> list[str]:
    """``NATIVE_MODULES`` of setup.py, read without running it (running it would build)."""
    tree = ast.parse(SETUP_PY.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "NATIVE_MODULES" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(v) for v in value]
    raise AssertionError("setup.py defines no NATIVE_MODULES")


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def test_listed_modules_exist_and_are_probed() -> None:
    listed = _listed()
    root = SETUP_PY.parent
    assert listed, "nothing to compile"
    for path in listed:
        assert (root / path).is_file(), path
    # ``hexflow sim-speed`` reports the build from its probes: each must be a compiled module.
    assert set(NATIVE_PROBES) <= {_module(p) for p in listed}


def test_build_kind_names_the_build() -> None:
    kind = build_kind()
    compiled = [m for m in NATIVE_PROBES if not str(importlib.import_module(m).__file__).endswith(".py")]
    if not compiled:
        assert kind == "python"
    elif len(compiled) == len(NATIVE_PROBES):
        assert kind == "native"
    else:
        assert kind.startswith("partly native")


@pytest.mark.skipif(os.environ.get("HEXFLOW_EXPECT_NATIVE") != "1", reason="only in `make test-native`")
def test_listed_modules_are_compiled() -> None:
    not_compiled = [m for m in map(_module, _listed()) if str(importlib.import_module(m).__file__).endswith(".py")]
    assert not not_compiled, f"imported from source, not compiled: {not_compiled}"
    assert build_kind() == "native"


def test_value_types_and_results_survive_pickling() -> None:
    """A bench sends setups to worker processes and gets results back by pickle; in the native build the
    frozen dataclasses among them are compiled classes, which need their own ``__reduce__``."""
    from gateway.bench.simbench import Setup
    from gateway.config import load_cluster
    from gateway.core.dag import DagCallSpec
    from gateway.core.prefix import PrefixSeg
    from gateway.core.samples import CallSample
    from gateway.core.workflow import CallSpec
    from gateway.sim.simulator import Simulator
    from gateway.sim.workload import load_queries

    workers = load_cluster("paper-4gpu")
    values = [
        workers[0].profile,
        PrefixSeg("schema", 1200, per_query=True),
        CallSample(800, 40, 3, 2500.0, 120.0, 1.25, 17.5),
        CallSpec("revise", 1800, 120, (PrefixSeg("schema", 1200, per_query=True),)),
        DagCallSpec("evaluate", 900, 30, (), node=4),
    ]
    for v in values:
        copy = pickle.loads(pickle.dumps(v))
        assert copy == v and type(copy) is type(v)
    setup = Setup(workers, load_queries("chess-bird", 12, random.Random(0)), "chess-bird", n_workflows=12, n_seeds=1)
    wfs = setup.workflows(0.05)
    res = Simulator(workers, "hexgen", seed=0).run(wfs)
    copy = pickle.loads(pickle.dumps(res))
    assert copy.num_calls == res.num_calls > 0
    assert [(r.wid, r.finish) for r in copy.workflows] == [(r.wid, r.finish) for r in res.workflows]
    assert pickle.loads(pickle.dumps(setup)).workers == setup.workers


def test_subclasses_of_compiled_classes_do_not_shadow_their_fields() -> None:
    """Compiled code reads a ``Call``'s or a ``CallSpec``'s fields from the compiled base's own storage; a slotted
    interpreted subclass (``dataclass(slots=True)``) would re-declare every field as a slot of its own, which
    compiled readers never see (they would find the field unset). Every subclass here must leave them alone,
    and a field set through the subclass must read back through the base's descriptor."""
    import dataclasses

    from gateway.bench.tuner import _Watched
    from gateway.core.dag import DagCallSpec, DagNode, DagWorkflow
    from gateway.core.workflow import Call, CallSpec, StagedWorkflow, Workflow
    from gateway.live.transport import LiveCall
    from gateway.sim.degrade import KnobbedWorkflow

    pairs = [
        (DagCallSpec, CallSpec),
        (LiveCall, Call),
        (DagWorkflow, Workflow),
        (KnobbedWorkflow, StagedWorkflow),
        (_Watched, StagedWorkflow),
    ]
    for sub, base in pairs:
        names = {f.name for f in dataclasses.fields(base)}
        for klass in sub.__mro__[: sub.__mro__.index(base)]:
            slots = klass.__dict__.get("__slots__", ())
            assert not names & set((slots,) if isinstance(slots, str) else slots), (klass, base)

    spec = DagCallSpec("evaluate", 900, 30, node=2)
    wf = DagWorkflow.build(7, "t", 1.0, 9.0, [DagNode("a", "evaluate", 900, 30)])
    call = LiveCall(id=3, workflow=wf, spec=spec, ready_at=1.5, endpoint="/v1/completions")
    for inst, base, name, want in [
        (spec, CallSpec, "kind", "evaluate"),
        (spec, CallSpec, "input_tokens", 900),
        (wf, Workflow, "deadline", 9.0),
        (call, Call, "spec", spec),
        (call, Call, "ready_at", 1.5),
    ]:
        getter = getattr(base.__dict__.get(name), "__get__", None)
        got = getter(inst, base) if getter is not None else getattr(inst, name)
        assert got == want, (base, name)


def test_a_pure_install_runs_without_mypy_extensions() -> None:
    """The runtime image installs no ``mypy_extensions`` (a development package): the class hint falls back to a
    no-op, and the workflow classes and their subclasses work as before."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['mypy_extensions'] = None\n"
        "from gateway.core.native import mypyc_attr\n"
        "from gateway.core.dag import DagCallSpec\n"
        "from gateway.core.workflow import Call, StagedWorkflow\n"
        "wf = StagedWorkflow(1, 't', 0.0, 5.0, [])\n"
        "c = Call(2, wf, DagCallSpec('evaluate', 9, 1, node=3), 0.5)\n"
        "assert mypyc_attr(allow_interpreted_subclasses=True)(int) is int\n"
        "print(c.spec.node, c.deadline)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "5.0"]
