"""``eft``: earliest finish time (HEFT's processor choice): the smallest ``t_queue + t_comp`` wins; ties go to the
lower ``t_comp``, then the lower position (``LeastWork(finish=True)``)."""

from __future__ import annotations

from gateway.core.dispatchers.base import Capabilities, register_dispatcher
from gateway.core.dispatchers.lw import LeastWork

register_dispatcher("eft", lambda _rng: LeastWork(finish=True), Capabilities())
