"""Flash-crowd arrivals (``flash_arrivals``): a Markov-modulated Poisson process."""

from __future__ import annotations

import itertools
import random

import pytest

from gateway.sim.workload.arrivals import FLASH_BURST, FLASH_CALM, flash_arrivals


def test_flash_arrivals_alternate_calm_spells_and_bursts_around_the_mean_rate() -> None:
    a = flash_arrivals(100_000, random.Random(1), mean_rate=2.0)
    assert a == sorted(a) and a[0] > 0
    assert len(a) / a[-1] == pytest.approx(2.0, rel=0.1)
    # Gaps come from two rates about 12x apart: the shortest tenth is far below the mean gap, the longest far above.
    gaps = sorted(b - x for x, b in itertools.pairwise(a))
    mean = a[-1] / len(a)
    assert gaps[len(gaps) // 2] < mean  # most arrivals come in bursts
    burst_gap, calm_gap = 1 / (FLASH_BURST * 2.0), 1 / (FLASH_CALM * 2.0)
    assert sum(g < 2 * burst_gap for g in gaps) > 0.4 * len(gaps)
    assert sum(g > calm_gap for g in gaps) > 0.1 * len(gaps)
    assert flash_arrivals(50, random.Random(3)) == flash_arrivals(50, random.Random(3))


def test_flash_arrivals_check_their_arguments() -> None:
    with pytest.raises(ValueError, match="mean_rate"):
        flash_arrivals(10, random.Random(0), mean_rate=0.0)
    with pytest.raises(ValueError, match="n must"):
        flash_arrivals(-1, random.Random(0))
    assert flash_arrivals(0, random.Random(0)) == []
