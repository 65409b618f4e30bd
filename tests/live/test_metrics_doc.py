"""docs/metrics.md lists every metric family the gateway registers, and nothing it does not."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.live.metrics import GatewayMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_every_registered_family_is_documented() -> None:
    m = GatewayMetrics(["w"], ["t"])
    families = {f.name for f in m.registry.collect() if f.name.startswith("hexflow_")}
    documented = set(re.findall(r"^\| (hexflow_[a-z_]+) \|", DOC.read_text(encoding="utf-8"), re.MULTILINE))
    # prometheus_client names counters without their _total suffix in collect().
    documented = {d.removesuffix("_total") for d in documented}
    assert families == documented
