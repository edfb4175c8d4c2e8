"""The autopilot on tiny data: settings tried with pilots (gold's weight among them, and the
student's objective: score distillation, which needs every training set's silver flags in the
pilots and in the final students), the best on dev trained to the end, every shared artifact
made once, and the run directory reused on a re-run."""

from __future__ import annotations

import json

import pytest

from augsbert_ray.config import validate_tree
from augsbert_ray.pipeline import run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_autopilot_chooses_on_dev_and_trains_the_choice(tmp_path, tiny_stsb, tiny_model, ray_local):
    cfg = validate_tree({
        "name": "tiny-auto", "run_dir": str(tmp_path / "run"),
        "data": {s: {"format": "stsb", "path": str(p)} for s, p in tiny_stsb.items()},
        "cross_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4},
        "bi_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8, "lr": 1e-4, "objective": "cosent-distill"},
        "sampling": {"strategy": "bm25", "top_k": 2},  # the job's own setting: in the grid, tried first
        "labeling": {"block_size": 64, "micro_batch_size": 16}, "evaluation": {"batch_size": 16},
        "auto": {"enabled": True, "teacher_recipes": [[1, 1e-4]], "strategies": ["bm25"], "top_k": [1, 2],
                 "calibration": ["none", "isotonic"], "gold_repeat": [1, 2], "objective": ["cosent-distill"],
                 "pilot_fraction": 0.5},
    })
    lines = []
    m = run_job(cfg, log=lines.append)
    a = m.result("auto").model_dump()
    grid = [f"teacher 1x0.0001, bm25 top-{k}, calibration {c}, gold x{r}, cosent-distill objective"
            for k in (1, 2) for c in ("none", "isotonic") for r in (1, 2)]
    own = "teacher 1x0.0001, bm25 top-2, calibration none, gold x1, cosent-distill objective"
    assert [r["setting"] for r in a["settings"]] == [own] + [g for g in grid if g != own]
    assert [r["job_setting"] for r in a["settings"]] == [True] + [False] * 7
    # Gold's weight changes only the pilot: gold counted twice beside the same silver.
    gold, by_label = m.result("gold").train, {r["setting"]: r for r in a["settings"]}
    for x1, x2 in zip(grid[::2], grid[1::2]):
        x1, x2 = by_label[x1], by_label[x2]
        assert x2["silver"] == x1["silver"] and x2["pilot_train_pairs"] - x1["pilot_train_pairs"] == gold
    scored = {r["setting"]: r["pilot_dev"] for r in a["settings"]}
    assert all(v is not None for v in scored.values()) and a["gold_only_pilot_dev"] is not None
    chosen = [r for r in a["settings"] if r["fate"] == "chosen"]
    best = max(scored, key=scored.get)
    # The best pilot replaces the job's own setting only when its lead is beyond dev's noise.
    search = json.loads(next((cfg.resolved_run_dir / "stages" / "auto").glob("*/search.json")).read_text())
    assert len(chosen) == 1 and search["why"] == a["why"]
    lead = a["lead_over_job_setting"]  # the best other pilot's gain over the job's own, paired on dev
    rival = max((k for k in scored if k != own), key=lambda k: (scored[k], k))
    assert lead["rival"] == rival and lead["difference"] == pytest.approx(scored[rival] - scored[own])
    if best == own:
        assert chosen[0]["setting"] == own and "the job's own setting, the best pilot" in a["why"] and rival in a["why"]
    elif lead["low"] > 0:
        assert chosen[0]["setting"] == best and "ahead of the job's own setting beyond dev noise" in a["why"]
    else:
        assert chosen[0]["setting"] == own and "the job's own setting, kept" in a["why"] and best in a["why"]
    # The job then ran the chosen setting: its teacher, candidates and labels are the pilot's own.
    rd = cfg.resolved_run_dir
    teachers = list((rd / "stages" / "cross_encoder").iterdir())
    assert len(teachers) == 1  # one recipe: one teacher for every setting
    assert len(list((rd / "stages" / "candidates").iterdir())) == 2  # once per amount, whatever the calibration
    assert len(list((rd / "stages" / "silver").iterdir())) == 2
    assert {"cross_encoder", "candidates", "silver"} <= set(m.stages_reused)  # made by the search, reused
    assert m.result("candidates").top_k == chosen[0]["overrides"]["sampling.top_k"]
    assert m.stage("augsbert").result.train_pairs == chosen[0]["pilot_train_pairs"]  # gold repeated as chosen
    assert m.bi_encoder_objective == chosen[0]["overrides"]["bi_encoder.objective"] == "cosent-distill"
    assert ("calibrate" in m.stage_seconds) == (chosen[0]["overrides"]["labeling.calibration"] == "isotonic")
    # Never a regression against gold only on dev: the shipped model is the better one there.
    s = m.result("ship")
    assert s.shipped == ("augsbert" if s.augsbert_dev >= s.gold_only_dev else "gold_only")
    assert (rd / "models" / "bi-encoder" / "model.safetensors").exists()
    summary = (rd / "summary.md").read_text()
    assert "Autopilot: 8 settings" in summary and "| chosen |" in summary and "Shipped as models/bi-encoder" in summary
    assert f"| {own} (the job's own) |" in summary and f"Chose {a['chosen']}: {a['why']}" in summary
    # The pilots' verdict: the best setting's pilot against gold only, paired on dev's pairs.
    gain = a["pilot_gain"]
    assert gain["resamples"] > 0 and gain["low"] <= gain["difference"] <= gain["high"]
    assert gain["difference"] == pytest.approx(scored[best] - a["gold_only_pilot_dev"])
    assert a["predicts_silver_helps"] == (True if gain["low"] > 0 else False if gain["high"] < 0 else None)
    assert f"Best silver pilot against gold only: {a['pilot_verdict']}." in summary
    assert search["chosen"] == chosen[0]["setting"]
    # A re-run does nothing again: every setting's stages and the pilots are reused.
    lines.clear()
    again = run_job(cfg, log=lines.append)
    assert again.result("auto").chosen == a["chosen"] and again.scores == m.scores
    # (the search itself runs again, as a loading stage does, and finds every stage it runs done)
    tried_again = [line for line in lines if line.startswith("[auto") and line.endswith("] started")]
    assert tried_again == ["[auto] started"], tried_again
