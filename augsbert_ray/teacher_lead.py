"""What a teacher's lead over the gold-only student on dev has meant for AugSBERT's gain, in
measured runs (``teacher_lead_data.MEASURED``, written by ``benchmarks/teacher_lead.py``; the
table: ``benchmarks/results/teacher_lead.md``). The teacher check quotes it before labelling:
the silver labels can teach the student only what the teacher knows better than it does.
"""

from __future__ import annotations

import math

RESULTS = "benchmarks/results/teacher_lead.md"
NEAREST = 4  # measured runs quoted: those whose lead was closest to this job's


def what_it_meant(lead: float, metric: str) -> str | None:
    """One sentence on the measured runs whose teacher led by about ``lead`` on dev (``metric``),
    and what AugSBERT gained over gold only on test there; None without such measurements."""
    from augsbert_ray.teacher_lead_data import MEASURED

    runs = [p for p in MEASURED if p["metric"] == metric]
    if not runs or math.isnan(lead):
        return None
    near = sorted(runs, key=lambda p: (abs(p["lead_dev"] - lead), p["lead_dev"]))[:NEAREST]
    leads = [p["lead_dev"] for p in near]
    gains = [p["gain_test"] for p in near]
    above = sum(p["low"] > 0 for p in near)
    return (f"in {len(near)} measured runs whose teachers led by {min(leads):+.2f} to {max(leads):+.2f} on dev, "
            f"AugSBERT gained {min(gains):+.2f} to {max(gains):+.2f} {metric} on test over gold only "
            f"({above} of {len(near)} intervals above 0; {RESULTS})")
