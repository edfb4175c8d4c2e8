"""summary.md of unfinished runs: written after every stage, before later stages' results exist;
`augsbert report` on damaged or unfinished runs."""

import json

import pytest

from augsbert_ray.cli import main
from augsbert_ray.errors import DataError
from augsbert_ray.metrics import RunMetrics
from augsbert_ray.report import show_run, summary_markdown


def _target_run(data: dict, sampling: dict) -> RunMetrics:
    return RunMetrics(job="da", task="binary", primary_metric="f1", run_dir="runs/da", complete=False,
                      data={"train": 40, "dev": 20, "test": 20, "skipped_rows": 0},
                      sampling=sampling,
                      target={"task": "binary", "metric": "auc_0.05", "data": data, "mix_source_gold": False,
                              "candidates": {}})


def test_a_domain_adaptation_summary_before_the_target_sets_are_loaded():
    text = summary_markdown(_target_run({}, {}))
    assert "(unfinished run)" in text and "Domain adaptation" not in text


def test_a_corpus_summary_before_its_pairs_are_labelled_and_after():
    data = {"test": {"pairs": 30}}
    before = summary_markdown(_target_run(data, {"strategy": "bm25", "sentences": 40, "candidates": 14}))
    assert "on 30 target test pairs. Silver: target corpus pairs, not labelled yet (target silver only)." in before
    after = summary_markdown(_target_run(data, {"strategy": "bm25", "sentences": 40, "candidates": 14, "labelled": 14, "silver": 12}))
    assert "Silver: 12 bm25 pairs of 40 target corpus sentences labelled by the cross-encoder" in after


# -- `augsbert report` on damaged or unfinished runs ---------------------------------------------
def _good() -> dict:
    m = RunMetrics(job="r", task="regression", primary_metric="spearman", run_dir="runs/r", complete=False,
                   data={"train": 40, "dev": 20, "test": 20, "skipped_rows": 0},
                   scores={"gold_only": {"dev": {"spearman": 70.0}, "test": {"spearman": 68.0}}},
                   stages_planned=["gold", "gold_only", "eval_gold_only", "teacher"])
    return m.to_dict()


def _nulls() -> dict:
    return {k: None for k in _good()}


DAMAGE = {
    "truncated": lambda: json.dumps(_good()).encode()[:50], "empty": lambda: b"",
    "random_bytes": lambda: bytes(range(256)) * 4, "a_list": lambda: b"[1, 2]",
    "all_nulls": lambda: json.dumps(_nulls()).encode(),
    "no_job": lambda: json.dumps({k: v for k, v in _good().items() if k != "job"}).encode(),
    "null_score": lambda: json.dumps({**_good(), "scores": {"gold_only": {"test": {"spearman": None}}}}).encode(),
    "bad_stage": lambda: json.dumps({**_good(), "stages": [{"name": "gold"}]}).encode(),
    "no_data_counts": lambda: json.dumps({**_good(), "data": {}}).encode(),
    "a_folder": None,
}
REASONS = {"truncated": "not valid JSON", "empty": "empty (0 bytes)", "random_bytes": "not UTF-8 text",
           "a_list": "holds a JSON list", "all_nulls": "field 'job' is null, not a JSON string",
           "no_job": "field 'job' missing", "null_score": "field 'scores.gold_only.test.spearman' missing or not a number",
           "bad_stage": "field 'stages[0].kind' missing", "no_data_counts": "field 'data.train' missing",
           "a_folder": "a folder, not the file a job writes"}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_report_on_a_damaged_metrics_file_says_what_is_wrong_in_one_line(tmp_path, capsys, damage):
    path = tmp_path / "metrics.json"
    if DAMAGE[damage] is None:
        path.mkdir()
    else:
        path.write_bytes(DAMAGE[damage]())
    with pytest.raises(DataError) as info:
        show_run(tmp_path)
    assert str(path) in str(info.value) and REASONS[damage] in str(info.value), str(info.value)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("augsbert: error: ") and REASONS[damage] in err[0]


def test_report_on_an_unfinished_run_says_so_and_what_is_left(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps(_good()))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "job.log").write_text("10:00:01 [1/4] gold done\n10:00:09 [4/4] teacher failed after 8s: "
                                               "TrainingError: boom\n")
    text = show_run(tmp_path)
    assert "every stage was done by an earlier run" not in text
    assert "Unfinished run: 0 of 4 stages done; not done: gold, gold_only, eval_gold_only, teacher." in text
    assert "Ray had not started when this report was written" in text
    assert "The job log's last failure: 10:00:09 [4/4] teacher failed after 8s: TrainingError: boom" in text
    (tmp_path / "metrics.json").write_text(json.dumps({**_good(), "complete": True}))
    done = show_run(tmp_path)
    assert "Unfinished" not in done and "failure" not in done and "every stage was done by an earlier run" in done


def test_the_density_plot_is_never_seen_half_written(tmp_path, monkeypatch):
    # `augsbert report` on a running job lists the plots: each appears whole, by a rename.
    import os

    from augsbert_ray import report

    target = tmp_path / "silver_density.png"
    target.write_bytes(b"an earlier run's plot")
    renames = []
    real_replace = os.replace

    def replace(src, dst):
        assert target.read_bytes() == b"an earlier run's plot"  # untouched until the new one is whole
        renames.append((os.path.basename(src), os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(report.os, "replace", replace)
    report.write_density_plot(target, [0.1, 0.5, 0.9], [0.2, 0.4], "t")
    assert renames == [(".silver_density.png.tmp", "silver_density.png")]
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in tmp_path.iterdir()] == [target.name]
