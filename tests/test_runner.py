"""The stage runner on toy stages (no Ray): reuse, resumption, --fresh, outputs, params and results."""

from __future__ import annotations

import json
import time

import pytest

from augsbert_ray.config import validate_tree
from augsbert_ray.progress.messages import lines_to
from augsbert_ray.rundir import RunDir
from augsbert_ray.runner import Runner
from augsbert_ray.stage_cache import publish
from augsbert_ray.stages.base import (Declaration, Stage, StageParams, StageResult, UndeclaredSetting,
                                      fingerprint_settings, placement_field)


def _cfg(**extra):
    return validate_tree({"name": "toy", "data": {s: {"format": "stsb", "path": f"{s}.csv"}
                                                   for s in ("train", "dev", "test")}, **extra})


class SourceParams(StageParams):
    epochs: int
    actors: int | None = placement_field(None)


class Count(StageResult):
    n: int
    resumed: bool = False


class Source(Stage):
    """Writes a number that depends on cross_encoder.epochs; "resumes" from a partial file."""

    name = "source"
    needs_ray = False
    result_type = Count

    def __init__(self):
        self.calls = []

    def declare(self, cfg):
        return Declaration(SourceParams(epochs=cfg.cross_encoder.epochs, actors=cfg.labeling.actors),
                           outputs=("n.json",))

    def run(self, inputs, params, env):
        partial = env.out / "partial"
        resumed = partial.exists()  # what a checkpoint left by an interrupted run looks like
        partial.write_text("state")
        self.calls.append({"resumed": resumed, "fresh": env.fresh})
        (env.out / "n.json").write_text(json.dumps(params.epochs * 10))
        return Count(n=params.epochs * 10, resumed=resumed)


class SeedParams(StageParams):
    seed: int


class Value(StageResult):
    value: int


class Double(Stage):
    name = "double"
    needs_ray = False
    result_type = Value

    def __init__(self):
        self.calls = 0

    def declare(self, cfg):
        return Declaration(SeedParams(seed=cfg.seed), inputs={"n": "source/n.json"}, outputs=("out.json",))

    def run(self, inputs, params, env):
        self.calls += 1
        value = inputs.json("n") * 2 + params.seed
        (env.out / "out.json").write_text(json.dumps(value))
        return Value(value=value)


def test_a_finished_stage_is_reused_and_a_changed_setting_gets_its_own_folder(tmp_path):
    rd = RunDir(tmp_path / "run")
    src, dbl = Source(), Double()
    first = Runner(_cfg(), rd).run(src)
    again = Runner(_cfg(), rd).run(src)
    assert not first.reused and again.reused and len(src.calls) == 1 and again.result == first.result
    changed = Runner(_cfg(cross_encoder={"epochs": 7}), rd)
    done = changed.run(src)
    assert done.result.n == 70 and done.folder != first.folder
    assert src.calls[-1] == {"resumed": False, "fresh": False}  # nothing of the other setting's run is seen
    assert changed.run(dbl).result.value == 140 + 42
    # Back to the first setting: its folder is still there and is reused.
    assert Runner(_cfg(), rd).run(src).reused and len(src.calls) == 2


def test_placement_settings_never_redo_a_stage(tmp_path):
    rd = RunDir(tmp_path / "run")
    src = Source()
    Runner(_cfg(), rd).run(src)
    assert Runner(_cfg(labeling={"actors": 5}), rd).run(src).reused and len(src.calls) == 1


def test_an_interrupted_stage_resumes_in_its_folder_and_fresh_starts_over(tmp_path):
    rd = RunDir(tmp_path / "run")
    src = Source()
    runner = Runner(_cfg(), rd)
    folder = runner.folder(src, runner.fingerprint(src))
    folder.mkdir(parents=True)
    (folder / "partial").write_text("state")  # a run that died before its marker
    assert runner.run(src).result.resumed is True
    done = Runner(_cfg(), rd, fresh=True).run(src)  # --fresh: the stage's folder is emptied first
    assert not done.reused and src.calls[-1] == {"resumed": False, "fresh": True}


def test_a_missing_output_redoes_the_stage_and_dependants_follow(tmp_path):
    rd = RunDir(tmp_path / "run")
    src, dbl = Source(), Double()
    runner = Runner(_cfg(), rd)
    done = runner.run(src)
    runner.run(dbl)
    (done.folder / "n.json").unlink()
    lines = []
    again = Runner(_cfg(), rd)
    with lines_to(lines.append):
        redone, downstream = again.run(src), again.run(dbl)
    assert not redone.reused and downstream.reused  # same content, same fingerprint downstream
    assert any("n.json is missing or changed; redoing it" in line for line in lines)


def test_a_stage_sees_its_params_only_frozen_and_its_declared_inputs_only(tmp_path):
    class Sneaky(Double):
        name = "sneaky"

        def run(self, inputs, params, env):
            return Value(value=inputs.json("other"))  # declared: n only

    runner = Runner(_cfg(), RunDir(tmp_path / "run"))
    runner.run(Source())
    with pytest.raises(UndeclaredSetting, match="input 'other'"):
        runner.run(Sneaky())
    params = Source().declare(_cfg()).params
    with pytest.raises(ValueError):
        params.epochs = 4  # frozen


def test_the_fingerprint_is_the_params_dump_without_placement_with_models_by_content():
    from augsbert_ray.config import CrossEncoderConfig

    class P(StageParams):
        cross_encoder: CrossEncoderConfig
        batch: int = placement_field(8)

    params = P(cross_encoder=CrossEncoderConfig(model="some/model"), batch=32)
    dump = fingerprint_settings(params, lambda name: f"id-of-{name}")
    assert "batch" not in dump and dump["cross_encoder"]["model"] == "id-of-some/model"
    assert dump["cross_encoder"]["epochs"] == params.cross_encoder.epochs


def test_a_child_runners_lines_carry_its_prefix_from_every_stage_thread(tmp_path):
    lines = []
    runner = Runner(_cfg(), RunDir(tmp_path / "run"))
    child = runner.child(_cfg(), log_prefix="[auto: x] ")
    with lines_to(lines.append):
        child.run_graph([Source(), Double()])  # each stage in a thread of its own
        runner.run(Source())  # the job's own runner: no prefix
    assert lines[:4] == ["[auto: x] [source] started", lines[1], "[auto: x] [double] started", lines[3]]
    assert lines[1].startswith("[auto: x] [source] done in") and lines[3].startswith("[auto: x] [double] done in")
    assert lines[4:] == ["[source] complete in an earlier run; skipped"]


def test_a_stored_result_of_another_shape_redoes_the_stage(tmp_path):
    rd = RunDir(tmp_path / "run")
    src = Source()
    done = Runner(_cfg(), rd).run(src)
    marker = done.folder / "done.json"
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps({**record, "result": {"count": "not this stage's"}}))
    lines = []
    with lines_to(lines.append):
        again = Runner(_cfg(), rd).run(src)
    assert not again.reused and len(src.calls) == 2 and again.result.n == done.result.n
    assert any("recorded result is of another version" in line for line in lines)


def test_a_stage_must_write_what_it_declares(tmp_path):
    class Lazy(Source):
        name = "lazy"

        def run(self, inputs, params, env):
            return Count(n=0)

    with pytest.raises(RuntimeError, match="did not write n.json"):
        Runner(_cfg(), RunDir(tmp_path / "run")).run(Lazy())


def test_publish_replaces_the_target_with_links(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "w.bin").write_text("one")
    target = tmp_path / "run" / "models" / "m"
    publish(src, target)
    assert (target / "w.bin").read_text() == "one" and (target / "w.bin").stat().st_ino == (src / "w.bin").stat().st_ino
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.bin").write_text("two")
    publish(other, target)
    assert sorted(p.name for p in target.iterdir()) == ["x.bin"]


class Meet(Stage):
    """A stage that finishes only once every stage of its group has started: they ran at once."""

    needs_ray = False

    def __init__(self, name: str, group, reads_from: str | None = None, fail: bool = False, delay: float = 0.0):
        self.name, self.group, self.reads_from, self.fail, self.delay = name, group, reads_from, fail, delay

    def declare(self, cfg):
        inputs = {"before": f"{self.reads_from}/out.json"} if self.reads_from else {}
        return Declaration(inputs=inputs, outputs=("out.json",))

    def run(self, inputs, params, env):
        if self.group is not None:
            self.group.wait(timeout=10)  # threading.Barrier: broken (an error) if the others never come
        if self.fail:
            raise RuntimeError(f"{self.name} failed")
        time.sleep(self.delay)
        (env.out / "out.json").write_text("1")
        return StageResult()


def test_independent_stages_run_at_once_and_dependants_wait(tmp_path):
    import threading

    both = threading.Barrier(2)
    order = []
    runner = Runner(_cfg(), RunDir(tmp_path / "run"))
    stages = [Meet("a", both), Meet("b", both), Meet("c", None, reads_from="a")]
    runner.run_graph(stages, after=lambda stage, done: order.append(stage.name))
    # a and b each waited at the barrier for the other, so they overlapped; c, which reads a, ended
    # after a (b may end before or after c: on a busy machine its thread can be the last to wake).
    assert sorted(order) == ["a", "b", "c"] and order.index("c") > order.index("a")
    assert set(runner.done) == {"a", "b", "c"} and runner.artifacts["c/out.json"].path.exists()


def test_the_first_failing_stage_stops_the_job_after_the_others_end(tmp_path):
    import threading

    both = threading.Barrier(2)
    runner = Runner(_cfg(), RunDir(tmp_path / "run"))
    stages = [Meet("a", both, fail=True), Meet("b", both, delay=0.5), Meet("c", None, reads_from="b")]
    with pytest.raises(RuntimeError, match="a failed"):
        runner.run_graph(stages)
    assert set(runner.done) == {"b"}  # b, running beside it, finished; c never started


def test_a_marker_cut_short_or_never_renamed_redoes_the_stage_in_its_folder(tmp_path):
    rd = RunDir(tmp_path / "run")
    src = Source()
    folder = Runner(_cfg(), rd).run(src).folder
    marker = (folder / "done.json").read_text()
    # A kill mid-commit: the marker's temporary file written, not yet renamed into place.
    (folder / "done.json").rename(folder / ".done.json.tmp")
    done = Runner(_cfg(), rd).run(src)
    assert not done.reused and src.calls[-1]["resumed"] is True
    # A marker cut short (a copy of the run directory that stopped mid-file).
    (folder / "done.json").write_text(marker[: len(marker) // 2])
    assert not Runner(_cfg(), rd).run(src).reused and len(src.calls) == 3
    assert Runner(_cfg(), rd).run(src).reused


def test_a_full_disk_at_the_marker_is_one_error_naming_it_and_nothing_is_marked(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    from augsbert_ray.errors import DiskFullError

    rd = RunDir(tmp_path / "run")
    src = Source()
    real = Path.write_text

    def full(self, text, *args, **kwargs):
        if self.name == ".done.json.tmp":
            real(self, text[:10], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, text, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Path, "write_text", full)
        with pytest.raises(DiskFullError, match=r"no space left on device while writing .*done\.json"):
            Runner(_cfg(), rd).run(src)
    folder = Runner(_cfg(), rd).folder(src, Runner(_cfg(), rd).fingerprint(src))
    assert not (folder / "done.json").exists() and not (folder / ".done.json.tmp").exists()
    done = Runner(_cfg(), rd).run(src)  # space freed: the stage is redone, resuming in its folder
    assert not done.reused and src.calls[-1]["resumed"] is True
