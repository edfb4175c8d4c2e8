"""summary.md assembled from the stages' typed results, for unfinished runs too (written after
every stage, before later stages' results exist); `augsbert report` on damaged, unfinished and
earlier-format runs."""

import json

import pytest

from augsbert_ray.cli import main
from augsbert_ray.errors import DataError
from augsbert_ray.metrics import RunMetrics, StageRecord
from augsbert_ray.report import show_run, summary_markdown
from augsbert_ray.stages.base import ScoreRow, StageResult
from augsbert_ray.stages.candidates import CandidatesResult
from augsbert_ray.stages.evaluate import EvalResult
from augsbert_ray.stages.gold import GoldResult, TargetResult, TargetSetCount
from augsbert_ray.stages.silver import Shards, SilverResult


def _record(name: str, result: StageResult, kind: str = "stage", reused: bool = False) -> StageRecord:
    return StageRecord(name=name, kind=kind, fingerprint="f" * 64, seconds=1.0, reused=reused, result=result)


GOLD = GoldResult(train=40, dev=20, test=20, baselines={"jaccard": {"dev": {"f1": 50.0}, "test": {"f1": 48.0}}})


def _target_run(*records: StageRecord) -> RunMetrics:
    return RunMetrics(job="da", task="binary", primary_metric="f1", run_dir="runs/da", complete=False,
                      stages=[_record("gold", GOLD, "load"), *records])


def test_a_domain_adaptation_summary_before_the_target_sets_are_loaded():
    text = summary_markdown(_target_run())
    assert "(unfinished run)" in text and "Domain adaptation" not in text and "Target task" not in text
    assert "| Jaccard word overlap | 50.00 | 48.00 |" in text  # the gold stage's own rows


def test_a_corpus_summary_before_its_pairs_are_labelled_and_after():
    target = _record("target", TargetResult(sets={"test": TargetSetCount(pairs=30)}, task="binary",
                                            baselines={"jaccard": {"target_test": {"auc_0.05": 12.0}}}))
    candidates = _record("candidates", CandidatesResult(source="target corpus", strategy="bm25", top_k=3,
                                                        sentences=40, candidates=14))
    before = summary_markdown(_target_run(target, candidates))
    assert "# da: AugSBERT (bm25) (unfinished run)" in before
    assert "Target task: binary; AUC(0.05) x100 on 30 target test pairs." in before
    assert "No upper bound: a target corpus has no labels." in before
    assert "Candidates: 14 pairs from 40 sentences (target corpus, bm25)." in before and "Labelled" not in before
    assert "| Jaccard word overlap | 12.00 |" in before  # no model scored on the target test set yet
    silver = _record("silver", SilverResult(labelled=14, silver=12, pairs_per_s=1.0, actors=1, cpus_per_actor=1.0,
                                            precision="fp32", shards=Shards(total=1, reused=0, labelled=1,
                                                                            block_size=0)))
    scored = _record("eval_augsbert", EvalResult(model="augsbert", scores={"target_test": {"auc_0.05": 33.0}},
                                                 target_metric="auc_0.05"))
    after = summary_markdown(_target_run(target, candidates, silver, scored))
    assert "Labelled: 14; silver pairs used: 12" in after
    table = after[after.index("## Domain adaptation"):]
    assert table.index("| AugSBERT: bi-encoder on target silver | 33.00 |") < table.index("| Jaccard word overlap | 12.00 |")


class _Toy(StageResult):
    """A result of a stage the report has never heard of."""

    widgets: int

    def section(self, ctx):
        return [f"Toy stage {ctx.stage}: {self.widgets} widgets."]

    def rows(self, ctx):
        return [ScoreRow(-1, "Toy model", {"test": {ctx.metric: 1.5}})]


def test_the_summary_is_assembled_from_the_results_own_sections_and_rows():
    m = RunMetrics(job="t", task="regression", primary_metric="spearman", run_dir="runs/t",
                   stages=[_record("gold", GoldResult(train=4, dev=2, test=2)), _record("toy", _Toy(widgets=3))])
    text = summary_markdown(m)
    assert "Toy stage toy: 3 widgets." in text and "| Toy model |  | 1.50 |" in text
    assert text.index("Gold pairs: train 4") < text.index("Toy stage toy")  # sections in stage order


def test_metrics_json_round_trips_typed_results_and_keeps_its_flat_views(tmp_path):
    m = _target_run(_record("eval_gold_only", EvalResult(model="gold_only", scores={"dev": {"f1": 60.0}})))
    m.write(tmp_path / "metrics.json")
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data["data"]["train"] == 40 and data["scores"] == {"gold_only": {"dev": {"f1": 60.0}}}
    assert data["baselines"]["jaccard"]["test"] == {"f1": 48.0}
    back = RunMetrics.load(tmp_path)
    assert isinstance(back.result("gold"), GoldResult) and back.result("gold").train == 40
    assert back.scores == m.scores and summary_markdown(back) == summary_markdown(m)


def test_a_metrics_file_of_the_earlier_format_still_reports(tmp_path):
    # Results were plain dicts, and evaluation results named no model: the stage name says it.
    old = {"job": "r", "task": "regression", "primary_metric": "spearman", "run_dir": "runs/r",
           "data": {"train": 40, "dev": 20, "test": 20}, "scores": {"gold_only": {"test": {"spearman": 68.0}}},
           "stages": [{"name": "gold", "kind": "load", "fingerprint": "a", "seconds": 1.0, "reused": False,
                       "result": {"train": 40, "dev": 20, "test": 20, "skipped_rows": 0}},
                      {"name": "eval_gold_only", "kind": "evaluate", "fingerprint": "b", "seconds": 1.0,
                       "reused": False, "result": {"scores": {"test": {"spearman": 68.0}}}},
                      {"name": "silver", "kind": "label", "fingerprint": "c", "seconds": 1.0, "reused": False,
                       "result": {"an": "earlier shape"}}]}
    (tmp_path / "metrics.json").write_text(json.dumps(old))
    text = show_run(tmp_path)
    assert "| Bi-encoder, gold only |  | 68.00 |" in text and "Gold pairs: train 40, dev 20, test 20" in text


# -- `augsbert report` on damaged or unfinished runs ---------------------------------------------
def _good(reused: bool = False) -> dict:
    m = RunMetrics(job="r", task="regression", primary_metric="spearman", run_dir="runs/r", complete=False,
                   stages=[_record("gold", GoldResult(train=40, dev=20, test=20), "load", reused),
                           _record("eval_gold_only", EvalResult(model="gold_only", scores={
                               "dev": {"spearman": 70.0}, "test": {"spearman": 68.0}}), "evaluate", reused)],
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
    assert "Unfinished run: 2 of 4 stages done; not done: gold_only, teacher." in text
    assert "Ray had not started when this report was written" in text
    assert "The job log's last failure: 10:00:09 [4/4] teacher failed after 8s: TrainingError: boom" in text
    (tmp_path / "metrics.json").write_text(json.dumps({**_good(reused=True), "complete": True}))
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


def test_a_stage_class_is_found_by_its_name_with_no_list_to_edit():
    from augsbert_ray.stages import result_type_of
    from augsbert_ray.stages.base import Stage

    class ProbeResult(StageResult):
        probed: int = 0

    class Probe(Stage):
        name = "probe_registered"
        result_type = ProbeResult

    assert result_type_of("probe_registered") is ProbeResult
    assert result_type_of("gold") is GoldResult
    assert result_type_of("eval_augsbert") is EvalResult  # named per instance, found by its prefix
    assert result_type_of("no_such_stage") is None


def test_report_on_a_live_run_says_it_is_still_running(tmp_path):
    from augsbert_ray.run_lock import RunLock

    (tmp_path / "metrics.json").write_text(json.dumps(_good()))
    with RunLock(tmp_path):  # what a running job holds
        text = show_run(tmp_path)
    assert "It is still running (run " in text and "The run is still running (run " in text
    assert "Ray had not started when this report was written." not in text.replace("its Ray had", "")
    after = show_run(tmp_path)  # the lock given up: a run that ended, however
    assert "still running (run" not in after and "Ray had not started when this report was written" in after
