"""Optional native build: the simulator's and the scheduler's hot modules compiled with mypyc.

Everything about the package is in pyproject.toml; this file only adds extension modules, and only when
``HEXFLOW_MYPYC=1`` is set at build time (``make native``, the container image). Without it the build is
pure Python, as before. The compiled modules make the same decisions as the Python ones (CI runs the
simulator's decision pin against both); they run the simulator 2-3x faster, which every capacity search and
the gateway's background alpha tuner spend their time in.

A native build needs a C compiler and mypy (in the lock's dev extras) in the build environment, so it runs
without build isolation: ``HEXFLOW_MYPYC=1 pip install --no-build-isolation --no-deps .``.
"""

from __future__ import annotations

import os
from typing import Any

from setuptools import setup

# The modules a simulation spends its time in (profile: dispatch estimates, the scheduler and its queues,
# the engine model, the event loop, the calls and workflows they read), all pure and fully typed. The
# workflow classes that other modules subclass are marked ``allow_interpreted_subclasses``
# (``gateway.core.native``); such a subclass must not be slotted (tests/sim/test_native.py). core.dag stays
# interpreted (the live gateway's DAG requests, not a simulation's hot path).
NATIVE_MODULES = [
    "gateway/core/dispatchers/base.py",
    "gateway/core/dispatchers/eft.py",
    "gateway/core/dispatchers/llmd.py",
    "gateway/core/dispatchers/lw.py",
    "gateway/core/dispatchers/p2c.py",
    "gateway/core/dispatchers/rr.py",
    "gateway/core/dispatchers/wb.py",
    "gateway/core/estimates.py",
    "gateway/core/latency.py",
    "gateway/core/prefix.py",
    "gateway/core/profile.py",
    "gateway/core/queues.py",
    "gateway/core/samples.py",
    "gateway/core/scheduler.py",
    "gateway/core/slo.py",
    "gateway/core/workflow.py",
    "gateway/sim/engine.py",
    "gateway/sim/events.py",
    "gateway/sim/simulator.py",
]


def _ext_modules() -> list[Any]:
    if os.environ.get("HEXFLOW_MYPYC", "") not in ("1", "true", "yes"):
        return []
    from mypyc.build import mypycify

    return mypycify(NATIVE_MODULES, opt_level="3", group_name="hexflow_native")


setup(ext_modules=_ext_modules())
