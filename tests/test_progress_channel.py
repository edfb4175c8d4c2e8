"""Progress from Ray workers reaches the driver's display through the channel."""

from __future__ import annotations

import io
import pickle
import re

from augsbert_ray.progress import JobProgress
from augsbert_ray.progress.channel import ProgressChannel, ProgressHandle
from augsbert_ray.progress.messages import handled_by


class _Recorder:
    """Stands in for the sink actor: records what ``push.remote`` is sent."""

    def __init__(self):
        self.pushed: list[list] = []
        self.push = self

    def remote(self, events):
        self.pushed.append(list(events))


def test_a_handle_batches_counts_and_sends_messages_at_once():
    sink = _Recorder()
    handle = ProgressHandle(sink, flush_s=3600)
    stage = handle.stage("silver")
    stage.set_total(100, unit="pairs")
    for _ in range(10):
        stage.advance(5)
    stage.update(60)
    stage.update(70)
    assert sink.pushed == []  # nothing sent before the interval or a flush
    stage.message("[silver] 7/10 shards labelled")  # a message goes at once, with what is pending
    assert sink.pushed == [[("total", "silver", 100, "pairs"), ("advance", "silver", 50), ("update", "silver", 70),
                            ("message", "[silver] 7/10 shards labelled")]]
    copy = pickle.loads(pickle.dumps(handle))  # what a worker gets: the sink, not the batch
    stage.advance(1)
    copy.flush()
    assert len(sink.pushed) == 1
    handle.flush()
    assert sink.pushed[-1] == [("advance", "silver", 1)]


def test_a_ray_task_advances_the_drivers_display(ray_local, tmp_path):
    import ray

    out = io.StringIO()

    @ray.remote(num_cpus=0)
    def label(progress, shards: int, rows: int) -> int:
        progress.add_total(shards * rows, unit="pairs")  # two tasks share the stage
        for i in range(shards):
            progress.advance(rows)
            if i == 1:
                progress.message(f"[silver] {i + 1}/{shards} shards labelled in a worker")
        progress.flush()
        return shards * rows

    with JobProgress(["silver"], stream=out, every_s=0, log_path=tmp_path / "job.log") as display, \
            handled_by(display.logging_handler()):  # workers' messages are logged on the driver
        with ProgressChannel(display, poll_s=0.2) as handle:
            display.start_stage("silver")
            assert ray.get([label.remote(handle.stage("silver"), 5, 20) for _ in range(2)]) == [100, 100]
        display.finish_stage("silver")
    text = out.getvalue()
    assert text.count("[silver] 2/5 shards labelled in a worker") == 2
    counts = [int(m) for m in re.findall(r"\[1/1\] silver  (\d+)/200 pairs", text)]
    assert counts and counts == sorted(counts) and counts[-1] == 200  # both tasks' pairs, in order, all of them
    assert "[1/1] silver done in" in text
