"""The autopilot (``auto.enabled``): the job's choices made on dev instead of guessed.

What decides whether AugSBERT helps is mostly the user's guesses: the teacher's recipe, the
sampling strategy, how many neighbours per sentence, whether the teacher's scores need
mapping to the gold scale, how much gold weighs beside the silver, the student's objective. The autopilot tries the
combinations in ``auto`` (each teacher recipe x strategy x top-k x calibration x gold
repeat), in that order, until ``auto.budget_minutes`` is spent: for each it runs the stages
that setting needs (teacher, candidates, labels, calibration) as the job itself would, so
every artifact is shared through the stages' fingerprints (one teacher per recipe,
candidates once per strategy and amount, labels once per teacher and candidates; settings
that differ only in gold repeat share them all), and then trains one short pilot of the
student per setting, and one on gold alone, as Ray Tune trials (``training.pilots``). A
setting's pilot trains on its own training set (gold repeated as it says, then its silver)
for the same fraction of its own run's steps. The teacher is chosen by what
the student reaches with its labels, not by its own dev score. The best setting on dev
becomes the job's, and the job trains it to the end; the report lists every setting with its
pilot's dev score, what it cost and its fate.

The autopilot runs before the job's stages (``choose``: the job's config in, the chosen config
out), so the job's stage graph is the chosen config's recipe, known before any of it runs; the
``auto`` stage (``AutoPilot``) then records the search for the report.

The job's own setting (``auto.keep_job_setting``) is tried first, and the best pilot replaces
it only when the paired bootstrap puts its lead over the job's own pilot on dev above 0:
pilots within what dev can tell apart are a coin toss (on STSb with 1,000 gold pairs two
teacher recipes piloted 0.02 apart, and the one chosen then trained a student 1.3 points
worse on test than the job as written).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from dataclasses import dataclass

from typing import Any

from augsbert_ray.config import AutoConfig
from augsbert_ray.errors import TrainingError
from augsbert_ray.stages.base import Declaration, Stage, StageParams, StageResult, SummaryContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    """One combination the autopilot can try."""

    label: str
    overrides: dict  # dotted key -> value

    def apply(self, cfg):
        from augsbert_ray.config import validate_tree

        tree = cfg.model_dump(mode="json")
        for key, value in self.overrides.items():
            node = tree
            *head, last = key.split(".")
            for k in head:
                node = node[k]
            node[last] = value
        tree["auto"]["enabled"] = False  # the setting itself is a plain job
        return validate_tree(tree)


def job_setting(cfg) -> Setting:
    """The job's own setting, named as the autopilot names the settings it tries."""
    c = cfg.cross_encoder
    own = cfg.auto.model_copy(update={"teacher_recipes": [(c.epochs, c.lr)], "strategies": [cfg.sampling.strategy],
                                      "top_k": [cfg.sampling.top_k], "calibration": [cfg.labeling.calibration],
                                      "gold_repeat": cfg.auto.gold_repeat and [cfg.bi_encoder.gold_repeat],
                                      # auto named as what it is, so a grid listing cosine holds the job's own
                                      "objective": cfg.auto.objective and [cfg.bi_encoder.resolved_objective(cfg.task)]})
    return _grid(own)[0]


def settings_to_try(auto, own: Setting | None = None) -> list[Setting]:
    """``own`` (the job's own setting) first, then every other combination of ``auto``'s lists,
    teacher recipes outermost (its most costly part), gold's weight and the student's objective
    innermost (they change only the pilot)."""
    if own is None:
        return _grid(auto)
    return [own, *(s for s in _grid(auto) if s.label != own.label)]


def _grid(auto) -> list[Setting]:
    out = []
    repeats = auto.gold_repeat or [None]  # None: the job's own bi_encoder.gold_repeat
    objectives = auto.objective or [None]  # None: the job's own bi_encoder.objective
    for (epochs, lr), strategy, k, calibration, repeat, objective in itertools.product(
            auto.teacher_recipes, auto.strategies, auto.top_k, auto.calibration, repeats, objectives):
        label = f"teacher {epochs}x{lr:g}, {strategy} top-{k}, calibration {calibration}"
        overrides = {"cross_encoder.epochs": epochs, "cross_encoder.lr": lr, "sampling.strategy": strategy,
                     "sampling.top_k": k, "labeling.calibration": calibration}
        if repeat is not None:
            label += f", gold x{repeat}"
            overrides["bi_encoder.gold_repeat"] = repeat
        if objective is not None:
            label += f", {objective} objective"
            overrides[OBJECTIVE_KEY] = objective
        out.append(Setting(label, overrides))
    return out


OBJECTIVE_KEY = "bi_encoder.objective"


def _stage_config(setting: Setting, cfg):
    """The config the stages of a setting run with: the setting's, but the job's own objective,
    so a setting that differs only in the objective shares the gold-only student (semantic
    search's embedding model), the candidates and the labels with the job's."""
    shared = {k: v for k, v in setting.overrides.items() if k != OBJECTIVE_KEY}
    return Setting(setting.label, shared).apply(cfg)


class AutoParams(StageParams):
    auto: AutoConfig


class AutoResult(StageResult):
    """The autopilot's choice: every setting tried, its pilot, cost and fate."""

    chosen: str
    overrides: dict[str, Any]
    why: str = ""
    lead_over_job_setting: dict[str, Any] | None = None
    settings: list[dict[str, Any]]
    gold_only_pilot_dev: float | None = None
    metric: str
    pilot_fraction: float
    budget_minutes: float
    seconds: float
    predicts_silver_helps: bool | None = None
    pilot_verdict: str | None = None
    pilot_gain: dict[str, Any] | None = None

    def section(self, ctx: SummaryContext) -> list[str]:
        m = self.metric
        gold = "n/a" if self.gold_only_pilot_dev is None else f"{self.gold_only_pilot_dev:.2f}"
        lines = [f"Autopilot: {len(self.settings)} settings, pilots of {self.pilot_fraction:.0%} of the student's "
                 f"steps scored on dev ({m}); gold only: {gold}. Chose {self.chosen}"
                 + (f": {self.why}" if self.why else "")
                 + f"; {self.seconds:.0f} s of the {self.budget_minutes:g}-minute budget."
                 + (f" Best silver pilot against gold only: {self.pilot_verdict}." if self.pilot_verdict else ""), "",
                 f"| setting | teacher dev {m} | silver pairs | pilot dev {m} | cost, s | fate |",
                 "|---|---:|---:|---:|---:|---|"]
        for r in self.settings:
            teacher = r.get("teacher_dev", {}).get(m)
            own = " (the job's own)" if r.get("job_setting") else ""
            pilot = "" if r.get("pilot_dev") is None else format(r["pilot_dev"], ".2f")
            lines.append(f"| {r['setting']}{own} | {'' if teacher is None else f'{teacher:.2f}'} | "
                         f"{r.get('silver', '')} | {pilot} | {r['seconds']:.0f} | {r['fate']} |")
        return lines

    def view(self, stage: str) -> dict:
        return {"auto": self.model_dump()}


@dataclass(frozen=True)
class Choice:
    """What the autopilot chose: the config the job runs, and the record of the search."""

    cfg: object  # config.JobConfig, with auto.enabled off
    record: dict


def choose(cfg, runner, recipe, progress=None) -> Choice:
    """Tries the settings of ``cfg.auto`` with pilots and picks the best on dev (see the module docstring).

    Each setting runs the recipe's own stages that its silver labels (and the teacher's dev
    score) need, cut short before the pilots, in a child runner of ``runner``: same run
    directory, cluster and fingerprints, so the job reuses what the search made.

    Args:
        cfg: the job, with ``auto.enabled``.
        runner: the job's runner (``runner.Runner``); only its children run anything.
        recipe: the job's stages for a config (``pipeline.recipe``).
        progress: a ``progress.StageProgress`` counting the settings tried (None: none).

    Returns:
        the chosen setting applied to ``cfg``, and the search's record (``AutoPilot`` writes it).

    Raises:
        RuntimeError: no pilot could be scored.
    """
    from augsbert_ray.stages.pilot import Pilot
    from augsbert_ray.stages.student import silver_artifact

    auto = cfg.auto
    own = job_setting(cfg) if auto.keep_job_setting else None
    candidates = settings_to_try(auto, own)
    budget = auto.budget_minutes * 60
    started = time.perf_counter()
    if progress is not None:
        progress.set_total(len(candidates), unit="settings")
    search = runner.child(cfg)
    for stage in recipe(cfg):
        if stage.loads:  # the gold pairs (and target sets), the same for every setting
            search.run(stage)
    pilots_runner = search.child(cfg, log_prefix="[auto] ")
    tried, gold_repeat, objective, records = {}, {}, {}, []
    for setting in candidates:
        if time.perf_counter() - started > budget:
            records.append({"setting": setting.label, "overrides": setting.overrides,
                            "fate": "not tried: the budget was spent", "seconds": 0.0})
            continue
        scfg = _stage_config(setting, cfg)
        child = search.child(scfg, log_prefix=f"[auto: {setting.label}] ")
        stages = [s for s in recipe(scfg) if not s.loads]
        silver = silver_artifact(scfg)
        needed = _upstream(child, stages, {silver.split("/")[0], "eval_cross_encoder"})
        seconds, t0 = 0.0, time.perf_counter()
        try:
            for stage in stages:
                if stage.name in needed:
                    done = child.run(stage)
                    seconds += 0.0 if done.reused else done.seconds
        except TrainingError as e:
            if not e.permanent:
                raise
            # A setting whose training cannot succeed (a teacher that diverges) is not piloted;
            # the others are. It is tried again on a re-run: a failure is not kept.
            log.warning(f"[auto] {setting.label}: {e}")
            records.append({"setting": setting.label, "overrides": setting.overrides, "job_setting": setting is own,
                            "fate": f"failed: {str(e).split(': ', 1)[-1][:200]}", "pilot_dev": None,
                            "seconds": time.perf_counter() - t0})
            if progress is not None:
                progress.advance(1)
            continue
        key = f"auto/{len(tried)}"
        pilots_runner.artifacts[key] = child.artifacts[silver]
        tried[setting.label] = key
        if "bi_encoder.gold_repeat" in setting.overrides:  # searched; otherwise the job's own
            gold_repeat[setting.label] = scfg.bi_encoder.gold_repeat
        if OBJECTIVE_KEY in setting.overrides:
            objective[setting.label] = setting.overrides[OBJECTIVE_KEY]
        teacher_dev = child.done["eval_cross_encoder"].result.scores["dev"]
        records.append({"setting": setting.label, "overrides": setting.overrides, "fate": "piloted",
                        "seconds": seconds, "teacher_dev": teacher_dev,
                        "silver": child.done["silver"].result.silver, "job_setting": setting is own})
        if progress is not None:
            progress.advance(1)
    pilots = pilots_runner.run(Pilot.trial(tried, auto.pilot_fraction, gold_repeat=gold_repeat, objective=objective,
                                           baseline=own.label if own is not None and own.label in tried else None))
    record = decide(records, pilots.result.model_dump(), auto)
    record["seconds"] = time.perf_counter() - started
    gold = record["gold_only_pilot_dev"]
    scored = sum(r.get("pilot_dev") is not None for r in records)
    log.info(f"[auto] chose {record['chosen']} of {scored} settings tried in {record['seconds']:.0f} s: "
             f"{record['why']}; gold-only pilot {'n/a' if gold is None else f'{gold:.2f}'}")
    return Choice(Setting("chosen", record["overrides"]).apply(cfg), record)


def _upstream(runner, stages, targets: set[str]) -> set[str]:
    """The stages ``targets`` read from, directly or not (data edges only: the search runs no checks)."""
    from augsbert_ray.graph import upstream

    deps = runner.dependencies(stages, order=False)
    return upstream(deps, targets & set(deps))


def decide(records: list[dict], pilots: dict, auto) -> dict:
    """The setting the job runs, from the settings tried (``records``, updated with their
    pilots' scores and fates) and the pilots' result (``Pilot``): the best pilot on dev, unless
    the job's own setting was tried and the best one's lead over it is within dev's noise.

    Returns:
        the search's record (``chosen``, its ``overrides``, ``why``, every setting...).

    Raises:
        RuntimeError: no pilot could be scored.
    """
    scores = {k: v["dev"] for k, v in pilots["pilots"].items()}
    for r in records:
        if r["setting"] in scores:
            pilot = pilots["pilots"][r["setting"]]
            r["pilot_dev"] = scores[r["setting"]]
            r["seconds"] += pilot["seconds"]
            r["pilot_train_pairs"] = pilot["train_pairs"]
    scored = [r for r in records if r.get("pilot_dev") is not None]
    if not scored:
        raise RuntimeError("the autopilot could not score any setting (every pilot failed or the budget "
                           "ran out before the first); raise auto.budget_minutes")
    best = max(scored, key=lambda r: r["pilot_dev"])
    kept = next((r for r in scored if r["job_setting"]), None)
    why = f"the best pilot on dev ({best['pilot_dev']:.2f})"
    if kept is not None and kept is not best:
        lead = pilots["over_baseline"]  # the best pilot's gain over the job's own, on dev
        span = (f"{lead['difference']:+.2f}, {lead['confidence']:.0%} interval {lead['low']:+.2f} to "
                f"{lead['high']:+.2f}")
        if lead["low"] > 0:
            why = f"the best pilot on dev, ahead of the job's own setting beyond dev noise ({span})"
        else:  # within noise (or a NaN interval: no sample could score both)
            why = (f"the job's own setting, kept: the best pilot ({best['setting']}) led it by no more than dev "
                   f"can tell apart ({span})")
            best = kept
    elif kept is not None:
        why = f"the job's own setting, the best pilot on dev ({best['pilot_dev']:.2f})"
        lead = pilots["over_baseline"]
        if lead is not None:
            why += f"; the next best, {lead['rival']}, trailed it by {-lead['difference']:.2f}"
    best["fate"] = "chosen"
    for r in scored:
        if r is not best:
            r["fate"] = "pilot only"
    return {"chosen": best["setting"], "overrides": best["overrides"], "why": why,
            "lead_over_job_setting": pilots["over_baseline"], "settings": records,
            "gold_only_pilot_dev": scores.get("gold only"), "metric": pilots["metric"],
            "pilot_fraction": auto.pilot_fraction, "budget_minutes": auto.budget_minutes,
            "predicts_silver_helps": pilots["predicts_silver_helps"],
            "pilot_verdict": pilots["verdict"], "pilot_gain": pilots["gain"]}


class AutoPilot(Stage):
    """The autopilot's search in the job: writes the record ``choose`` returned (``search.json``),
    so that the report lists every setting tried. Runs every time; the stages the search ran
    are reused through their own fingerprints."""

    name = "auto"
    kind = "search"
    needs_ray = False
    always = True
    unit = "settings"
    result_type = AutoResult
    runs_after = ("gold", "target")  # the report written after it reads the gold pairs

    def __init__(self, record: dict):
        self.record = record

    def declare(self, cfg) -> Declaration:
        return Declaration(AutoParams(auto=cfg.auto), outputs=("search.json",))

    def run(self, inputs, params: AutoParams, env) -> AutoResult:
        result = AutoResult(**self.record)
        (env.out / "search.json").write_text(json.dumps(result.model_dump(), indent=2), encoding="utf-8")
        return result
