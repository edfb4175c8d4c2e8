"""augsbert bench's pure core: records, rendering, the ceiling's analysis, the plan, the
inputs it makes, and a failing part that leaves the others running. No Ray."""

from __future__ import annotations

import json

import numpy as np
import pytest

from augsbert_ray.bench import ceiling, hardware, render
from augsbert_ray.bench.records import BenchReport, Measure, PartResult


def _report() -> BenchReport:
    lab = PartResult("labelling", "Labelling")
    lab.add("peer", 100.0, "pairs/s", side="peer")
    lab.add("engine, 1 actor, steady", 250.0, "pairs/s", vs="peer")
    lab.data["actors"] = {"steady": [[1, 250.0], [2, 480.0]], "start included": [[1, 120.0], [2, None]]}
    bad = PartResult("bm25", "BM25", status="failed", error="ImportError: no tantivy")
    return BenchReport(mode="quick", command="augsbert bench --quick", started="2026-01-01 00:00 UTC",
                       hardware={"cpu": "Some CPU", "cores": 2, "gpus": ["H100 (80 GiB)"]},
                       versions={"ray": "2.0"}, load_average={"start": [3.5, 2.0, 1.0]}, parts=[lab, bad])


def test_a_report_round_trips_through_json_and_compares_with_its_peer():
    r = _report()
    back = BenchReport.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r
    lab = back.part("labelling")
    assert lab.ratio(lab.get("engine, 1 actor, steady")) == pytest.approx(2.5)
    assert lab.ratio(lab.get("peer")) is None
    with pytest.raises(ValueError, match="side"):
        Measure("x", 1.0, "s", side="ours")


def test_the_markdown_names_the_machine_the_load_each_ratio_and_a_failed_part():
    text = render.markdown(_report(), "plot.png")
    assert "Some CPU" in text and "H100 (80 GiB)" in text and "start 3.50, 2.00, 1.00" in text
    assert "| engine, 1 actor, steady | 250 | pairs/s | 2.50x |" in text
    assert "## BM25 (failed)" in text and "ImportError: no tantivy" in text
    assert "Parts that failed: bm25" in text and "![pairs/s against labelling actors](plot.png)" in text


def test_the_plot_is_drawn_from_the_actor_series_or_says_why_not(tmp_path):
    pytest.importorskip("matplotlib")
    name, note = render.plot(_report(), tmp_path)
    assert name == render.PLOT and (tmp_path / name).stat().st_size > 0 and note == ""
    assert render.actor_series(_report())["start included"] == [(1, 120.0)]  # unmeasured points left out
    empty = BenchReport(mode="quick", command="", started="")
    assert render.plot(empty, tmp_path) == (None, "No plot: the labelling part measured no actor pool.")


def _times(**kw) -> ceiling.PhaseTimes:
    base = dict(pairs=100_000, shards=100, wall=20.0, input=1.0, queued=4.0, first_shard=6.0, commit=2.0,
                driver_cpu_queued=3.6, driver_cpu_pool=4.0, peak_rss=300 * 2**20, steady_pairs_per_s=12_000.0,
                rss_before=200 * 2**20)
    return ceiling.PhaseTimes(**{**base, **kw})


def test_the_ceiling_names_the_longest_phase_that_grows_with_the_pairs():
    c = ceiling.analyse(_times())
    # pool 16 s: start 6 (paid once: not the limit), commits 2, transfer 8
    assert c.phases[ceiling.START] == 6.0
    assert c.phases[ceiling.POOL] == pytest.approx(8.0)
    assert c.limit.startswith("Ray Data") and "not CPU-bound" in c.limit
    assert c.pairs_per_s == 12_000.0 and c.end_to_end_pairs_per_s == 5_000.0 and c.peak_rss_mib == 300.0
    assert c.rss_growth_mib == 100.0
    slow_queue = ceiling.analyse(_times(queued=15.0, wall=27.0, driver_cpu_queued=14.0))
    assert slow_queue.limit.startswith(ceiling.QUEUE) and "CPU-bound there (0.93" in slow_queue.limit
    assert ceiling.analyse(_times(steady_pairs_per_s=None)).pairs_per_s == pytest.approx(100_000 / 16)
    with pytest.raises(ValueError, match="inconsistent"):
        ceiling.analyse(_times(queued=30.0))


def test_steady_rates_and_the_devices_one_driver_feeds():
    assert ceiling.steady_rate([0.0, 1.0], [10, 10]) is None
    assert ceiling.steady_rate([5.0, 6.0, 7.0], [100, 100, 50]) == pytest.approx(75.0)
    assert ceiling.devices_fed(100_000, 25_000) == 4.0
    assert ceiling.devices_fed(100_000, None) is None


def test_gpus_one_driver_feeds_follow_from_its_cpu_per_shard():
    from augsbert_ray.bench.control_plane import driver_ms_per_shard, gpus_fed

    # 8,192 pairs per 2 ms of driver CPU: 4,096,000 pairs/s, 16.4 GPUs at 250,000 pairs/s each
    assert gpus_fed(2.0, 8192, 250_000) == pytest.approx(16.384)
    assert gpus_fed(35.1, 8192, 100_000) == pytest.approx(2.334, abs=1e-3)
    assert driver_ms_per_shard(_times(driver_cpu_queued=1.0, driver_cpu_pool=4.0)) == pytest.approx(50.0)


def test_the_cpu_model_comes_from_lscpu_else_cpuinfo():
    assert hardware.cpu_model("Architecture: x86_64\nModel name:   AMD EPYC 9654\n", "") == "AMD EPYC 9654"
    assert hardware.cpu_model("", "processor\t: 0\nmodel name\t: Intel Xeon\n") == "Intel Xeon"


def test_full_mode_runs_the_control_plane_at_ten_million_pairs_in_over_a_thousand_shards():
    from augsbert_ray.bench.labeling import actor_counts
    from augsbert_ray.bench.suite import plan_for

    full, quick = plan_for(False, True, 16), plan_for(True, False, 2)
    assert full.null_pairs == 10_000_000 and -(-full.null_pairs // full.null_block) >= 1000
    assert quick.null_pairs < full.null_pairs and quick.max_cpu_actors == 2
    assert actor_counts(1) == [1] and actor_counts(2) == [1, 2] and actor_counts(6) == [1, 2, 4, 6]


def test_synthetic_pairs_stand_in_for_a_missing_benchmark(tmp_path):
    from augsbert_ray.bench import data

    s1, s2 = data.sentence_pairs(tmp_path, 50)
    assert len(s1) == len(s2) == 50 and len(set(s1 + s2)) == 100
    assert len(data.unique_sentences(tmp_path, limit=30)) == 30


def test_control_plane_shards_are_distinct_pairs_and_the_null_scorer_labels_without_a_model():
    import pyarrow as pa

    from augsbert_ray import schema
    from augsbert_ray.labeling import codec
    from augsbert_ray.bench.control_plane import NULL_LABEL, NullScorer, shards

    timer = [0.0]
    got = list(shards(["a b", "c d", "e"], 25, 10, timer))
    assert [t.num_rows for t in got] == [10, 10, 5] and timer[0] > 0
    table = pa.concat_tables(got)
    assert table.schema == schema.CANDIDATE_SCHEMA
    pairs = list(zip(table.column(schema.SENTENCE1).to_pylist(), table.column(schema.SENTENCE2).to_pylist()))
    assert len(set(pairs)) == 25 and pairs[0] == ("a b 0", "c d 0")
    batch = got[0].append_column(codec.IDS, pa.array([[1, 2]] * 10, pa.list_(pa.int64())))
    out = NullScorer(model_dir="unused", precision="bf16")(batch)
    assert codec.IDS not in out.column_names
    assert np.all(out.column(schema.LABEL).to_numpy() == NULL_LABEL)


def test_a_failing_part_is_reported_and_the_next_still_runs(tmp_path):
    from augsbert_ray.bench.suite import Bench

    report = BenchReport(mode="quick", command="x", started="now")
    bench = Bench(tmp_path, report, lambda line: None)

    def broken(result):
        result.add("measured before the failure", 1.0, "s", side="info")
        raise RuntimeError("boom\nsecond line")

    bench.part("bm25", broken)
    bench.part("training", lambda result: result.add("fine", 2.0, "s", side="info"))
    saved = json.loads((tmp_path / "report.json").read_text())
    assert [(p["part"], p["status"], p["error"]) for p in saved["parts"]] == [
        ("bm25", "failed", "RuntimeError: boom"), ("training", "ok", None)]
    assert saved["parts"][0]["measures"][0]["name"] == "measured before the failure"
    assert "boom" in (tmp_path / "logs" / "bm25.traceback.txt").read_text()
    assert "## BM25: queries per second" in (tmp_path / "report.md").read_text()


def test_an_unknown_part_is_one_error_line_before_ray_starts(capsys):
    from augsbert_ray.cli import main

    assert main(["bench", "--parts", "labelling", "gpu-melting", "--out", "unused"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("augsbert: error:") and "gpu-melting" in err[0]


def test_a_timed_search_keeps_each_querys_top_k_others_and_the_peer_matches_faiss_flat():
    from augsbert_ray.bench.semantic import recall, sample_queries, st_search, timed_search
    from augsbert_ray.candidates.semantic import build_faiss_index
    from augsbert_ray.config import FaissConfig

    rng = np.random.default_rng(0)
    emb = rng.standard_normal((300, 16)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    q_ids, queries = sample_queries(emb, 50)
    assert len(set(q_ids.tolist())) == 50 and np.array_equal(queries, emb[q_ids])
    brute = np.argsort(-(queries @ emb.T), axis=1)[:, 1:4]  # each query's row comes first: left out
    peer = timed_search(lambda: None, lambda _, q: st_search(emb, q, 4), queries, q_ids, 3)
    flat = timed_search(lambda: build_faiss_index(emb, FaissConfig(use_gpu=False), 0),
                        lambda ix, q: ix.search(q, 4), queries, q_ids, 3)
    assert np.array_equal(peer.hits, brute) and recall(flat.hits, peer.hits) == 1.0
    assert peer.queries_per_s > 0 and all(q not in row for q, row in zip(q_ids, flat.hits))


def test_the_steady_labelling_rates_are_compared_with_the_tuned_peer_and_say_so(monkeypatch):
    from types import SimpleNamespace

    from augsbert_ray.bench import labeling as labelling
    from augsbert_ray.bench.suite import plan_for

    monkeypatch.setattr(labelling, "peer_rate", lambda model, s1, s2, device, batch=32, bf16=False:
                        200.0 if batch > 32 else 100.0)
    monkeypatch.setattr(labelling, "bf16_supported", lambda device: True)
    monkeypatch.setattr(labelling, "pipeline_rate", lambda *a: {"start_included": 150.0, "steady": 400.0,
                                                               "first_shard_s": 2.0, "shards": 8, "seconds": 3.0})
    lab = PartResult("labelling", "Labelling")
    plan = plan_for(quick=True, gpu=False, cpus=1)
    labelling.run(lab, "model", lambda n: (["a"] * n, ["b"] * n), SimpleNamespace(gpus=0, cpus=1), plan, "cpu",
                  lambda line: None, lambda: None)
    steady = lab.get("engine: Ray pipeline, 1 CPU actor(s), steady")
    assert lab.ratio(steady) == pytest.approx(2.0)  # 400 against the tuned 200, not the defaults' 100
    assert f"against the tuned peer (batch {plan.peer_batch}, bf16 weights)" in steady.note
    start = lab.get("engine: Ray pipeline, 1 CPU actor(s), start included")
    assert lab.ratio(start) == pytest.approx(1.5) and "against its defaults" in start.note
