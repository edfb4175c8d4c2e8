"""The control-plane part end to end on a small pair count: every pair goes through the
labelling pipeline with the null scorer, committed by the actors, and the run's phases add up;
plain Ray Data moves the same pairs."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_null_scorer_labels_every_pair_through_the_pipeline(ray_local, tmp_path):
    pytest.importorskip("psutil")
    from augsbert_ray import labeling
    from augsbert_ray.bench.ceiling import analyse
    from augsbert_ray.bench.control_plane import measure, measure_peer, write_inputs

    lines, pool = [], ["a man plays", "a woman sings", "dogs run"]
    t = measure(pool, pairs=600, block_size=100, actors=1, cluster_cpus=2, log=lines.append)
    assert labeling.PairScorer.__name__ == "PairScorer"  # the pipeline's own class, never swapped
    # the actors committed every shard (measure checks shard 0's manifest names its writer)
    assert (t.pairs, t.shards) == (600, 6) and t.peak_rss > 0 and t.commit == 0
    assert 0 < t.input <= t.queued < t.wall and t.first_shard > 0
    c = analyse(t)
    assert c.end_to_end_pairs_per_s == pytest.approx(600 / t.wall)
    assert sum(c.phases.values()) == pytest.approx(t.wall, rel=0.05)
    assert any("600 pairs queued" in line for line in lines)
    _, parts, _ = write_inputs(pool, 600, 100, tmp_path)
    peer = measure_peer(parts, 600, 100, 1, lines.append)  # checks every pair was written
    assert (peer.pairs, peer.blocks) == (600, 6) and peer.wall > 0 and peer.driver_cpu > 0


def test_the_driver_capacity_separates_its_cpu_per_shard_from_its_cpu_while_waiting():
    from augsbert_ray.bench.control_plane import driver_capacity

    # 2% of a core while waiting, 0.5 ms a shard: 2% + 0.5 ms x 10/s and 2% + 0.5 ms x 40/s
    fit = driver_capacity(0.02 + 0.0005 * 40, 40.0, 0.02 + 0.0005 * 10, 10.0)
    assert fit["ms_per_shard"] == pytest.approx(0.5) and fit["waiting_rate"] == pytest.approx(0.02)
    assert fit["shards_per_s"] == pytest.approx(0.98 / 0.0005)
    assert driver_capacity(0.05, 10.0, 0.02, 10.0) is None  # the same shard rate: no way to tell the parts apart
    assert driver_capacity(None, 10.0, 0.02, 1.0) is None
