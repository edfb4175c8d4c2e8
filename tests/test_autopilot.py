"""The autopilot: a function from a job's config to the chosen config (``stages.auto.choose``).

Its decision (``decide``) on pilots' results built to have one answer each, without Ray; and end
to end on tiny data where exactly one setting can help: the other's teacher diverges (a learning
rate so large its weights overflow), so its labels, and every student trained on them, score
nothing on dev. The search's stages are the job's own (shared through their fingerprints), the
job trains the choice, and a re-run reuses everything, the pilots included."""

from __future__ import annotations

import json

import pytest

from augsbert_ray.config import validate_tree
from augsbert_ray.pipeline import run_job
from augsbert_ray.progress.messages import lines_to
from augsbert_ray.stages.auto import decide

OWN, OTHER = "own setting", "other setting"


def _records():
    return [{"setting": OWN, "overrides": {"sampling.top_k": 2}, "fate": "piloted", "seconds": 1.0,
             "job_setting": True},
            {"setting": OTHER, "overrides": {"sampling.top_k": 5}, "fate": "piloted", "seconds": 1.0,
             "job_setting": False}]


def _pilots(own: float | None, other: float | None, low: float) -> dict:
    pilots = {OWN: own, OTHER: other, "gold only": 50.0}
    lead = None if own is None or other is None else {"rival": OTHER, "difference": other - own, "low": low,
                                                      "high": low + 2, "confidence": 0.9}
    return {"pilots": {k: {"dev": v, "seconds": 2.0, "train_pairs": 10} for k, v in pilots.items()},
            "over_baseline": lead, "metric": "spearman", "predicts_silver_helps": None, "verdict": "",
            "gain": None}


class _Auto:
    pilot_fraction, budget_minutes = 0.5, 5


@pytest.mark.parametrize("own,other,low,chosen,why", [
    (60.0, 70.0, 1.0, OTHER, "ahead of the job's own setting beyond dev noise"),  # a lead beyond noise
    (60.0, 61.0, -1.0, OWN, "the job's own setting, kept"),  # a lead within noise: the job's own
    (70.0, 60.0, -12.0, OWN, "the job's own setting, the best pilot"),
    (None, 60.0, 0.0, OTHER, "the best pilot on dev"),  # the job's own could not be scored
])
def test_the_autopilot_decides_on_the_pilots_lead_over_the_jobs_own(own, other, low, chosen, why):
    record = decide(_records(), _pilots(own, other, low), _Auto())
    assert record["chosen"] == chosen and why in record["why"]
    assert record["overrides"] == {"sampling.top_k": 2 if chosen == OWN else 5}
    assert [r["fate"] for r in record["settings"]].count("chosen") == 1
    assert record["gold_only_pilot_dev"] == 50.0


def test_the_autopilot_needs_one_scored_pilot():
    with pytest.raises(RuntimeError, match="could not score any setting"):
        decide(_records(), _pilots(None, None, 0.0), _Auto())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_autopilot_chooses_the_one_setting_that_can_help(tmp_path, tiny_stsb, tiny_model, ray_local):
    from augsbert_ray.context import JobContext
    from augsbert_ray.pipeline import _start_cluster, recipe
    from augsbert_ray.rundir import RunDir
    from augsbert_ray.runner import Runner
    from augsbert_ray.stages.auto import choose

    cfg = validate_tree({
        "name": "tiny-auto", "run_dir": str(tmp_path / "run"),
        "data": {s: {"format": "stsb", "path": str(p)} for s, p in tiny_stsb.items()},
        # the job's own teacher diverges: its weights overflow at the first step
        "cross_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e30},
        "bi_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4, "objective": "cosent-distill",
                       "gold_repeat": 2},
        "sampling": {"strategy": "bm25", "top_k": 2},
        "labeling": {"block_size": 64, "micro_batch_size": 16}, "evaluation": {"batch_size": 16},
        "auto": {"enabled": True, "teacher_recipes": [[1, 1e30], [1, 1e-4]], "strategies": ["bm25"], "top_k": [2],
                 "calibration": ["none"], "gold_repeat": [2], "objective": ["cosent-distill"],
                 "pilot_fraction": 0.5},
    })
    own = "teacher 1x1e+30, bm25 top-2, calibration none, gold x2, cosent-distill objective"
    right = "teacher 1x0.0001, bm25 top-2, calibration none, gold x2, cosent-distill objective"
    rd = RunDir(cfg.resolved_run_dir)
    ctx = JobContext(start=lambda: _start_cluster(cfg, rd))
    runner = Runner(cfg, rd, ctx=ctx)
    try:
        choice = choose(cfg, runner, recipe)
    finally:
        ctx.close()
    a = choice.record
    assert [r["setting"] for r in a["settings"]] == [own, right]
    assert a["chosen"] == right and a["why"].startswith("the best pilot on dev")
    by_label = {r["setting"]: r for r in a["settings"]}
    assert by_label[own]["pilot_dev"] is None and by_label[right]["pilot_dev"] is not None
    # the diverged teacher stopped its setting (a permanent training error), and only that one
    assert by_label[own]["fate"].startswith("failed: ") and "loss is nan" in by_label[own]["fate"]
    gold_in_pilots = {r["pilot_train_pairs"] - r["silver"] for r in a["settings"] if "pilot_train_pairs" in r}
    job = choice.cfg
    assert (job.cross_encoder.lr, job.bi_encoder.gold_repeat, job.auto.enabled) == (1e-4, 2, False)
    assert runner.done == {} and runner.artifacts == {}  # the search ran in runners of its own
    # The job runs the chosen setting: its teacher, candidates and labels are the search's own.
    m = run_job(cfg)
    auto = m.result("auto")
    assert auto.chosen == right and auto.settings[1]["pilot_dev"] == a["settings"][1]["pilot_dev"]
    assert {"cross_encoder", "candidates", "silver"} <= set(m.stages_reused)
    assert m.stage("augsbert").result.train_pairs == by_label[right]["pilot_train_pairs"]
    assert m.bi_encoder_objective == "cosent-distill"
    assert gold_in_pilots == {2 * m.result("gold").train}  # gold counted twice beside the silver
    teachers = list((cfg.resolved_run_dir / "stages" / "cross_encoder").iterdir())
    assert len(teachers) == 2  # one per recipe (the diverged one never finished)
    search = json.loads(next((cfg.resolved_run_dir / "stages" / "auto").glob("*/search.json")).read_text())
    assert search["chosen"] == right
    summary = (cfg.resolved_run_dir / "summary.md").read_text()
    assert "Autopilot: 2 settings" in summary and f"| {own} (the job's own) |" in summary
    assert f"Chose {right}: {a['why']}" in summary
    # A re-run does nothing again but try the diverged teacher once more (a failure is not kept):
    # every finished stage of every setting and the pilots are reused.
    lines = []
    with lines_to(lines.append):
        again = run_job(cfg)
    assert again.result("auto").chosen == right and again.scores == m.scores
    started = sorted(line for line in lines if line.endswith("] started"))  # (gold and auto run at once)
    assert started == [f"[auto: {own}] [cross_encoder] started", "[auto] started", "[gold] started",
                       "[gold] started", "[ship] started", "[teacher_check] started"], started
