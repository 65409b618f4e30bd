"""``eft``: earliest finish time (HEFT's processor choice): the smallest ``t_queue + t_comp`` wins; ties go to the
lower ``t_comp``, then the lower position."""

from __future__ import annotations

from gateway.core.dispatchers.base import Capabilities, DispatchView, Rng, register_dispatcher
from gateway.core.dispatchers.lw import least_position


class EarliestFinish:
    """HEFT-style earliest finish time: least predicted ``t_queue + t_comp``."""

    def choose(self, view: DispatchView) -> int:
        """Minimum ``t_queue + t_comp``; ties to the lower ``t_comp``, then the lower position."""
        return least_position(view, True)


def _make(rng: Rng) -> EarliestFinish:
    return EarliestFinish()


register_dispatcher("eft", _make, Capabilities())
