"""Stage budgets (DESIGN.md, point 3): a stage ready at ``now`` gets
``(deadline - now) * t(s) / (t(s) + sum of t(r) over the expected remaining stages r)``; past the deadline the
budget is negative, which makes its calls the most urgent."""

from __future__ import annotations


def stage_budget(deadline: float, now: float, stage_cost: float, remaining_cost: float) -> float:
    """Budget in seconds for a stage of expected cost ``stage_cost`` followed by ``remaining_cost`` (both 0: all)."""
    left = deadline - now
    total = stage_cost + remaining_cost
    if total <= 0.0 or left <= 0.0:  # late: keep the overshoot, so later-arrived work does not jump ahead of it
        return left
    return left * stage_cost / total
