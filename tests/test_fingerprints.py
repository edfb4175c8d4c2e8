"""Which stages a changed setting redoes, for every key of the job config (no Ray, nothing trained).

Each leaf key of three jobs (in-domain with KDE sampling and a seed search, in-domain with
semantic search, and domain adaptation with labelled target pairs) is changed to another
valid value, and the stages whose fingerprints change must be exactly the stages whose
params (what their ``run`` sees, placement fields included) change, and their dependants:
none for placement keys (actors, CPUs, GPUs, batch sizes, workers), whatever params they
reach, and for data files only what their content reaches. A table of cases that matter
most pins the answer independently of the params.
"""

from __future__ import annotations

import shutil
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from augsbert_ray.config import JobConfig, validate_tree
from augsbert_ray.pipeline import recipe
from augsbert_ray.stages.base import config_leaves

pytestmark = pytest.mark.timeout(180)
ALWAYS = ("gold", "target", "auto", "teacher_check", "ship")  # stages that run every time: no fingerprint to keep


@pytest.fixture(scope="module")
def world(tmp_path_factory, _tiny_model_master):
    """Data files (and changed copies) and two tiny models with different weights."""
    from conftest import write_mrpc, write_stsb

    root = tmp_path_factory.mktemp("fp")
    files = {}
    for split, n, seed in (("train", 30, 1), ("dev", 16, 2), ("test", 16, 3)):
        files[split] = write_stsb(root / f"sts-{split}.csv", n, seed)
        files[f"{split}-changed"] = write_stsb(root / f"sts-{split}-b.csv", n, seed + 10)
        files[f"{split}-copy"] = Path(shutil.copy(files[split], root / f"copy-{split}.csv"))
    for name, n, seed in (("pairs", 20, 4), ("ttest", 16, 5), ("tdev", 12, 6)):
        files[name] = write_mrpc(root / f"{name}.txt", n, seed)
        files[f"{name}-changed"] = write_mrpc(root / f"{name}-b.txt", n, seed + 10)
    (root / "corpus.txt").write_text("A man is eating.\nA dog runs.\nThe chef cooks.\n", encoding="utf-8")
    models = {"a": str(_tiny_model_master), "b": str(root / "model-b")}
    shutil.copytree(_tiny_model_master, models["b"])
    (Path(models["b"]) / "extra.txt").write_text("another model")  # other content, other id
    return root, files, models


def _base(world, kind: str) -> dict:
    root, f, m = world
    tree = {
        "name": "fp", "run_dir": str(root / "run"),
        "data": {s: {"format": "stsb", "path": str(f[s])} for s in ("train", "dev", "test")},
        "cross_encoder": {"model": m["a"]}, "bi_encoder": {"model": m["a"]},
    }
    if kind == "kde+search":
        tree["sampling"] = {"strategy": "kde"}
        tree["seed_search"] = {"enabled": True, "targets": ["bi_encoder", "cross_encoder"], "seeds": 2}
    elif kind == "ss":
        tree["sampling"] = {"strategy": "bm25+ss", "ss_model": "zero_shot"}
    elif kind == "adaptation":
        tree["target"] = {"pairs": {"format": "mrpc", "path": str(f["pairs"])},
                          "test": {"format": "mrpc", "path": str(f["ttest"])},
                          "dev": {"format": "mrpc", "path": str(f["tdev"])}, "task": "binary"}
    return tree


# -- changing one key ---------------------------------------------------------------------
def _candidates(path: str, value, annotation, world) -> list:
    """Other valid values for a key, most telling first."""
    root, f, m = world
    if path.endswith(".model"):
        return [m["b"] if value == m["a"] else m["a"]]
    if path.endswith(".path") and isinstance(value, str):
        for key, p in f.items():
            if str(p) == value:
                return [str(f[f"{key}-changed"])] + ([str(f[f"{key}-copy"])] if f"{key}-copy" in f else [])
        return [str(root / "corpus.txt")]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, value + 2]  # + 2: counts where 1 is refused (evaluation.pilot_folds)
    if isinstance(value, float):
        return [value * 0.5, value + 0.5]
    if isinstance(value, str):
        return [a for a in _literals(annotation) if a != value] or [value + "x"]
    if isinstance(value, tuple):
        return [(value[0], value[1] * 2)]
    if isinstance(value, dict):
        return [{**value, "train": 20}, {"dev": 10}]
    if isinstance(value, list):
        return [value[:-1] or value + value, list(reversed(value)), [7, 9]]
    if value is None:
        return [2, 1, 0.5, "bm25", "x", [1, 2], {"format": "mrpc", "path": str(f["tdev"])}, (0.0, 10.0), 7,
                (0.0, 1.0), ["cosine"]]  # a list of names: auto.objective
    return []


def _literals(annotation) -> list:
    out = []
    for a in typing.get_args(annotation) or ():
        if typing.get_origin(a) is typing.Literal:
            out += list(typing.get_args(a))
        elif isinstance(a, str):
            out.append(a)
    return out


def _set(tree: dict, path: str, value) -> dict:
    import copy

    tree = copy.deepcopy(tree)
    node = tree
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return tree


def _dependants(stages, changed: set[str], artifacts: set[str], cfg) -> set[str]:
    """``changed`` and every stage that takes one of ``artifacts`` or an output of a changed
    stage, transitively."""
    out = set(changed)
    for stage in stages:
        if any(aid in artifacts or aid.split("/")[0] in out for aid in stage.declare(cfg).inputs.values()):
            out.add(stage.name)
    return out


def _expected(path: str, base_cfg: JobConfig, base_plan: dict, new_cfg: JobConfig, new_plan: dict) -> set[str]:
    """For a non-placement ``path``, the stages whose params differ between the two configs
    (compared whole, placement fields too) or that only one of them has, plus what the loading
    stages' changed content reaches, plus their dependants."""
    from augsbert_ray.stages.base import _is_placement

    stages = recipe(new_cfg)
    owner, name = _owner(new_cfg, path)
    placement = owner is not None and _is_placement(owner, name)
    direct = set()
    if not placement:
        before = {s.name: s.declare(base_cfg).params.model_dump(mode="json") for s in recipe(base_cfg)}
        for stage in stages:
            if not stage.always and stage.declare(new_cfg).params.model_dump(mode="json") != before.get(stage.name):
                direct.add(stage.name)
    contents = {k.removesuffix("#content") for k in new_plan if k.endswith("#content")
                and new_plan[k] != base_plan.get(k)}
    reached = _dependants(stages, direct, contents, new_cfg)
    names = {s.name for s in stages if not s.always}
    if {s.name for s in recipe(base_cfg)} != {s.name for s in stages}:  # a stage came or went
        reached |= {n for n in names if n not in base_plan}
    return reached & names


def _owner(cfg, path: str):
    node = cfg
    parts = path.split(".")
    for part in parts[:-1]:
        node = getattr(node, part, None)
        if not isinstance(node, BaseModel):
            return None, None
    return node, parts[-1]


def _plan(cfg, run_dir) -> dict:
    """Stage fingerprints, plus the content fingerprints of what the loading stages read."""
    from augsbert_ray.rundir import RunDir
    from augsbert_ray.runner import Runner

    runner = Runner(cfg, RunDir(run_dir))
    out = runner.plan(recipe(cfg))
    for aid, artifact in runner.artifacts.items():
        if aid.split("/")[0] in ("gold", "target"):
            out[aid + "#content"] = artifact.fp
    return out


UNCHANGEABLE_HERE = {
    # (job kind, key): why no other value of it can be tried with these files
    "data.train.format", "data.dev.format", "data.test.format",  # another format cannot read an STSb file
    "target.pairs.format", "target.test.format", "target.dev.format",
    "data.train.hf_split", "data.dev.hf_split", "data.test.hf_split",  # hub datasets only
    "data.train.hf_config", "data.dev.hf_config", "data.test.hf_config",
    "target.pairs.hf_split", "target.pairs.hf_config", "target.test.hf_split", "target.test.hf_config",
    "target.dev.hf_split", "target.dev.hf_config",
    "data.train.genres", "data.dev.genres", "data.test.genres",  # the tiny files have one genre
    "target.pairs.genres", "target.test.genres", "target.dev.genres",
    "target.pairs.columns.genre", "target.test.columns.genre", "target.dev.columns.genre",
    "data.train.columns.genre", "data.dev.columns.genre", "data.test.columns.genre",
    "target.corpus",  # a job has target pairs or a corpus, not both
    # refused without evaluation.pilot (the base jobs have none), and in adaptation (no target gold)
    "evaluation.pilot_folds",
    "target",  # in-domain jobs; the domain-adaptation job changes every target key
    "task",  # regression labels in [0, 1] are not binary; the binary path has its own tests
    "name",  # rejected values aside, a name only names the run directory (checked below)
    # silver-first is refused where the seed search picks the student (kde+search); MUST has the others
    "bi_encoder.curriculum",
    # a teacher used as given is refused where the seed search picks the teacher (kde+search)
    "cross_encoder.train",
}


@pytest.mark.parametrize("kind", ["kde+search", "ss", "adaptation"])
def test_a_changed_key_redoes_exactly_the_stages_that_read_it(world, kind, tmp_path):
    base_tree = _base(world, kind)
    base_cfg = validate_tree(base_tree)
    base_plan = _plan(base_cfg, tmp_path / "base")
    tried, untried, last = 0, [], None
    for path, owner, name in config_leaves(base_cfg):
        value = getattr(owner, name)
        annotation = type(owner).model_fields[name].annotation
        for candidate in _candidates(path, value, annotation, world):
            try:
                cfg = validate_tree(_set(base_tree, path, candidate))
                new_plan = _plan(cfg, tmp_path / f"run{tried}")
            except (ValidationError, Exception) as e:  # not valid here: try the next value
                last = e
                continue
            changed = {k for k in new_plan if "#" not in k and k not in ALWAYS
                       and new_plan[k] != base_plan.get(k)}
            assert changed == _expected(path, base_cfg, base_plan, cfg, new_plan), (path, value, candidate)
            tried += 1
            break
        else:
            untried.append(path)
    assert set(untried) <= UNCHANGEABLE_HERE, (set(untried) - UNCHANGEABLE_HERE, last)
    assert tried >= 60, tried
    print(f"\n{kind}: {tried} keys changed, {len(untried)} not changeable with these files")


# What must hold whatever the stages declare: the cases that went wrong before.
MUST = [
    # (job kind, override, stages redone)
    ("kde+search", "labeling.precision=int8", {"silver", "augsbert", "eval_augsbert"}),
    ("kde+search", "labeling.actors=4", set()),
    ("kde+search", "labeling.block_size=7", set()),
    ("kde+search", "training.num_workers=2", set()),
    ("kde+search", "training.use_gpu=true", set()),
    ("kde+search", "evaluation.batch_size=5", set()),
    ("kde+search", "seed_search.cpus_per_trial=1", set()),
    ("kde+search", "sampling.searchers=3", set()),
    ("kde+search", "sampling.kde.bandwidth=0.3", {"silver", "augsbert", "eval_augsbert"}),
    ("ss", "sampling.kde.bandwidth=0.3", set()),  # not KDE sampling: nothing reads it
    ("ss", "bi_encoder.max_length=64", {"candidates", "silver", "augsbert", "eval_augsbert", "gold_only",
                                        "eval_gold_only", "eval_zero_shot"}),
    ("ss", "sampling.faiss.shards=2", set()),
    ("ss", "cross_encoder.max_length=64", {"cross_encoder", "eval_cross_encoder", "silver", "augsbert",
                                           "eval_augsbert"}),
    ("adaptation", "training.precision=bf16", {"cross_encoder", "eval_cross_encoder", "gold_only", "eval_gold_only",
                                               "target_gold", "eval_target_gold", "silver", "augsbert",
                                               "eval_augsbert"}),
    ("adaptation", "target.mix_source_gold=true", {"augsbert", "eval_augsbert"}),
    ("adaptation", "evaluation.teacher_check=stop", set()),
    ("kde+search", "labeling.calibration=isotonic", {"calibrate", "augsbert", "eval_augsbert"}),
    ("ss", "evaluation.shipping=augsbert", set()),  # which model is shipped: decided every run, trains nothing
    ("ss", "auto.budget_minutes=5", set()),  # the autopilot is off: nothing reads it
    ("ss", "evaluation.pilot=true", {"pilot"}),  # a check beside the job: nothing else changes
    # gold's weight in both students' training sets (the gold-only reference counts gold as
    # often): the teacher, and candidates not embedded by the gold-only student, stay
    ("ss", "bi_encoder.gold_repeat=3", {"gold_only", "eval_gold_only", "augsbert", "eval_augsbert"}),
    ("adaptation", "bi_encoder.gold_repeat=3", set()),  # target silver alone: no gold to repeat
    # silver first, then gold: AugSBERT alone; the gold-only reference has no silver to order
    ("ss", "bi_encoder.curriculum=silver-first", {"augsbert", "eval_augsbert"}),
    ("adaptation", "bi_encoder.curriculum=silver-first", set()),  # target silver alone: nothing to order
    # The student's objective: both students train with it; the teacher, and candidates not
    # embedded by the gold-only student (zero-shot semantic search, KDE), stay
    ("ss", "bi_encoder.objective=cosent", {"gold_only", "eval_gold_only", "augsbert", "eval_augsbert"}),
    ("kde+search", "bi_encoder.objective=cosent-distill", {"gold_only", "eval_gold_only", "augsbert",
                                                           "eval_augsbert"}),
    ("ss", "auto.objective=[cosent]", set()),  # the autopilot is off: nothing reads it
    # the teacher used as given: its model's content alone; labels and AugSBERT follow it, gold only does not
    ("ss", "cross_encoder.train=false", {"cross_encoder", "eval_cross_encoder", "silver", "augsbert",
                                         "eval_augsbert"}),
    ("ss", "training.length_grouping=0", {"cross_encoder", "eval_cross_encoder", "gold_only", "eval_gold_only",
                                          "silver", "augsbert", "eval_augsbert"}),
]


@pytest.mark.parametrize("kind,override,expected", MUST, ids=[m[1] for m in MUST])
def test_cases_that_matter(world, kind, override, expected, tmp_path):
    import yaml

    key, value = override.split("=")
    base_tree = _base(world, kind)
    base = _plan(validate_tree(base_tree), tmp_path / "a")
    new = _plan(validate_tree(_set(base_tree, key, yaml.safe_load(value))), tmp_path / "b")
    assert {k for k in new if "#" not in k and k not in ALWAYS and new[k] != base.get(k)} == expected


def test_an_evaluation_set_rescores_and_retrains_nothing(world, tmp_path):
    root, f, _ = world
    base_tree = _base(world, "adaptation")
    base = _plan(validate_tree(base_tree), tmp_path / "a")
    for key, file in (("data.test.path", f["test-changed"]), ("target.test.path", f["ttest-changed"]),
                      ("target.dev.path", f["tdev-changed"])):
        new = _plan(validate_tree(_set(base_tree, key, str(file))), tmp_path / key)
        changed = {k for k in new if "#" not in k and k not in ALWAYS and new[k] != base[k]}
        assert changed and all(k.startswith("eval_") for k in changed), (key, changed)
    # the same pairs read from another path change nothing
    new = _plan(validate_tree(_set(base_tree, "data.train.path", str(f["train-copy"]))), tmp_path / "copy")
    stages = [k for k in base if "#" not in k and k != "gold"]
    assert [new[k] for k in stages] == [base[k] for k in stages]


def test_the_job_name_and_run_directory_place_results_only(world, tmp_path):
    base_tree = _base(world, "ss")
    a = _plan(validate_tree(base_tree), tmp_path / "a")
    b = _plan(validate_tree({**base_tree, "name": "other", "run_dir": str(tmp_path / "elsewhere")}), tmp_path / "b")
    assert a == b


def test_a_setting_added_later_leaves_the_fingerprints_of_earlier_runs_at_its_default(world):
    from augsbert_ray.stages import AugSBERT
    from augsbert_ray.stages.base import fingerprint_settings

    def settings(tree):
        return fingerprint_settings(AugSBERT().declare(validate_tree(tree)).params, str)["bi_encoder"]

    tree = _base(world, "ss")
    # bi_encoder.curriculum came after runs were made: at mixed, what the engine did before, it is
    # not part of the fingerprint, so those runs are still complete; silver-first is
    assert "curriculum" not in settings(tree) and "gold_repeat" in settings(tree)
    assert settings(_set(tree, "bi_encoder.curriculum", "silver-first"))["curriculum"] == "silver-first"
    assert settings(_set(tree, "bi_encoder.curriculum", "mixed")) == settings(tree)


def test_a_teacher_used_as_given_is_fingerprinted_by_its_model_alone(world):
    from augsbert_ray.stages import Teacher
    from augsbert_ray.stages.base import fingerprint_settings

    def settings(tree):
        return fingerprint_settings(Teacher().declare(validate_tree(tree)).params, str)

    tree = _base(world, "ss")
    # cross_encoder.train came after runs were made: at true it is left out, so their teachers stay done
    assert "train" not in settings(tree)["cross_encoder"]
    given = _set(tree, "cross_encoder.train", False)
    assert settings(given)["cross_encoder"]["train"] is False
    for key, value in (("cross_encoder.epochs", 9), ("cross_encoder.lr", 1e-3), ("seed", 7),
                       ("training.precision", "bf16")):  # nothing trains: the recipe changes nothing
        assert settings(_set(given, key, value)) == settings(given), key
        assert settings(_set(tree, key, value)) != settings(tree), key
    assert settings(_set(given, "cross_encoder.model", world[2]["b"])) != settings(given)
    # nor the gold pairs it would have trained on
    root, f, _ = world
    base = _plan(validate_tree(given), root / "given-a")
    other = _plan(validate_tree(_set(given, "data.train.path", str(f["train-changed"]))), root / "given-b")
    assert other["cross_encoder"] == base["cross_encoder"] and other["gold_only"] != base["gold_only"]


def test_a_stages_variant_is_in_its_params_never_guessed_from_its_inputs(world):
    from augsbert_ray.stages import AugSBERT, GoldOnly, Pilot, Silver, TargetGold, Teacher

    kde, ss, adapt = (validate_tree(_base(world, kind)) for kind in ("kde+search", "ss", "adaptation"))
    assert Silver().declare(kde).params.selection.sampling.strategy == "kde"  # labels a pool, keeps a selection
    assert Silver().declare(ss).params.selection is None
    for stage in (Teacher(), GoldOnly(), AugSBERT()):  # the seed search is on for both encoders in kde+search
        assert stage.declare(kde).params.seed_search is not None and stage.declare(ss).params.seed_search is None
    assert TargetGold().declare(adapt).params.seed_search is None  # dev is the source's: never searched
    assert TargetGold().declare(adapt).params.objective == "softmax"  # the binary target's objective
    assert AugSBERT().declare(ss).params.mix and not AugSBERT().declare(adapt).params.mix
    trial = Pilot.trial({"a": "silver/silver.parquet"}, 0.25).declare(ss).params
    job = Pilot().declare(ss).params
    assert (trial.silver_sets, trial.fraction) == (("a",), 0.25) and job.silver_sets is None
    assert job.fraction == ss.evaluation.pilot_fraction
