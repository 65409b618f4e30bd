"""``eft``: earliest finish time, the classic list-scheduling heuristic for heterogeneous clusters.

The worker with the smallest ``t_queue + t_comp`` (when the call could start there plus how long it would run there)
wins: HEFT's processor choice (Topcuoglu et al. 2002). Ties go to the lower ``t_comp``, then the lower position.
"""

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
