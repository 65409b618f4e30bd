"""Stage budgets: the share of the remaining end-to-end deadline a stage may use.

From the HexGen-Flow paper (DESIGN.md, point 3): when a stage becomes ready at ``now``,

    budget(s) = (deadline - now) * t(s) / (t(s) + sum of t(r) over the expected remaining stages r)

so the remaining time is split in proportion to expected cost. Because it is computed from the time
left *when the stage becomes ready*, a stage that ran late shrinks the budgets of all that follow.
A workflow already past its deadline gets a negative budget, which makes its calls the most urgent.
"""

from __future__ import annotations


def stage_budget(deadline: float, now: float, stage_cost: float, remaining_cost: float) -> float:
    """Budget in seconds for a stage of expected cost ``stage_cost`` followed by ``remaining_cost``.

    With no cost information at all (both zero) the stage gets the whole remaining time.
    """
    left = deadline - now
    total = stage_cost + remaining_cost
    if total <= 0.0:
        return left
    if left <= 0.0:
        # Late: keep the overshoot, so later-arrived work does not jump ahead of it.
        return left
    return left * stage_cost / total
