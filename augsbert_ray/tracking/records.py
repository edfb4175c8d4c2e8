"""What a job records for tracking, from its config and its typed results (pure: no library)."""

from __future__ import annotations

import math
from typing import Any


def config_params(tree: dict, prefix: str = "") -> dict[str, str]:
    """A job config (``JobConfig.model_dump(mode="json")``) as flat parameters: dotted key -> value."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(config_params(value, name + "."))
        else:
            out[name] = "null" if value is None else str(value)
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_metrics(metrics) -> dict[str, float]:
    """A run's figures as metrics: every model's scores (``score/<model>/<split>/<metric>``, x100),
    the times and fixed costs of the stages this invocation ran (``stage/<name>/seconds``...),
    and the teacher check's dev scores and gap. Stages reused from an earlier run have no times
    here (``run_tags`` marks them): nothing of them ran now."""
    out: dict[str, float] = {}
    for model, splits in metrics.scores.items():
        for split, values in splits.items():
            for metric, value in values.items():
                if metric != "pairs" and _finite(value):
                    out[f"score/{model}/{split}/{metric}"] = float(value)
    for s in metrics.stages:
        if s.reused:
            continue
        out[f"stage/{s.name}/seconds"] = s.seconds
        if s.fixed_seconds is not None:
            out[f"stage/{s.name}/fixed_seconds"] = s.fixed_seconds
        if s.host_start_seconds is not None:
            out[f"stage/{s.name}/host_start_seconds"] = s.host_start_seconds
    check = metrics.result("teacher_check")
    if check is not None:
        for key in ("cross_encoder_dev", "gold_only_dev", "gap"):
            value = getattr(check, key, None)
            if _finite(value):
                out[f"teacher_check/{key}"] = float(value)
    shipped = metrics.result("ship")
    if shipped is not None:
        for key in ("augsbert_dev", "gold_only_dev"):
            value = getattr(shipped, key, None)
            if _finite(value):
                out[f"ship/{key}"] = float(value)
    return out


def run_tags(metrics) -> dict[str, str]:
    """A run's tags: each stage as run now or reused from an earlier run, the teacher check's
    verdict and the shipping decision."""
    tags = {f"stage.{s.name}": "reused (earlier run)" if s.reused else "ran" for s in metrics.stages}
    tags["stages_reused"] = ", ".join(metrics.stages_reused) or "none"
    tags["complete"] = str(metrics.complete).lower()
    check = metrics.result("teacher_check")
    if check is not None and _finite(getattr(check, "gap", None)):
        tags["teacher_check"] = (f"cross-encoder {check.cross_encoder_dev:.2f} vs gold-only {check.gold_only_dev:.2f} "
                                 f"on dev ({check.gap:+.2f}): " + ("the teacher leads" if check.gap > 0 else
                                                                   "the teacher does not lead"))
    shipped = metrics.result("ship")
    if shipped is not None and hasattr(shipped, "shipped"):
        tags["shipped"] = shipped.shipped
        tags["shipping_decision"] = f"{shipped.policy}: {shipped.why}"
    teacher = metrics.result("cross_encoder")
    if teacher is not None and getattr(teacher, "given", False):
        tags["teacher"] = "used as given (cross_encoder.train: false)"
    return tags
