"""The cards of a job's models: built from its config, the stages' results and the run's metrics.

A training stage writes its model's card when the model is saved, with what the stage knows
(``write_trained_card``). After every stage (``report.finish``) each model this job trained
and published under ``<run dir>/models/`` gets its card rebuilt from the job's config and the
run's metrics so far (``publish_cards``): the later scores, the teacher check and the shipping
decision reach the cards of models trained early, and a re-run that reuses every stage still
leaves cards that describe this configuration's models.

A card is written under a new name and renamed into place (``write_card``): a published
folder holds hard links to its stage's files, and a stage's outputs never change after its
marker. No card is part of a model's content id (``models.model_content_id``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from augsbert_ray.config import resolved_objective
from augsbert_ray.model_card import CARD, EMBEDDED_HUB_ID, CardData, SilverFacts, TrainingFacts, render_card


def base_model_id(name: str) -> str | None:
    """A configured model's Hugging Face id (the embedded model's own), None for a local folder."""
    from augsbert_ray.models import EMBEDDED_MODEL

    if name == EMBEDDED_MODEL:
        return EMBEDDED_HUB_ID
    if name.startswith((".", "/", "~")) or os.path.isdir(os.path.expanduser(name)) or name.count("/") > 1:
        return None
    return name


def training_facts(encoder, objective: str, seed: int, precision: str, stats: dict,
                   pairs: int | None) -> TrainingFacts:
    """How an encoder was trained, from its config section (``cross_encoder`` / ``bi_encoder``) and
    the stage's training statistics (``training.fit.fit_encoder``)."""
    search = stats.get("seed_search")
    num_layers = getattr(encoder, "num_layers", None)
    own_seed = getattr(encoder, "seed", None)  # the bi-encoder may have its own
    return TrainingFacts(
        objective=objective, epochs=encoder.epochs, batch_size=encoder.batch_size, lr=encoder.lr,
        warmup_ratio=encoder.warmup_ratio, max_length=encoder.max_length,
        seed=search["chosen_seed"] if search else (seed if own_seed is None else own_seed),
        precision=stats.get("precision") or precision, num_layers=num_layers,
        base_layers=_layers(encoder.model) if num_layers else None, pairs=pairs,
        steps=search["total_steps"] if search else stats.get("steps"), final_loss=stats.get("final_loss"),
        seed_search=(f"chosen on dev by a seed search over seeds {', '.join(map(str, search['seeds']))}"
                     if search else ""))


def _layers(name: str) -> int | None:
    """The base model's transformer layers, where its config is on this machine."""
    from augsbert_ray.models import EMBEDDED_MODEL, embedded_model_dir

    try:
        path = embedded_model_dir(verify=False) if name == EMBEDDED_MODEL else Path(name).expanduser()
    except Exception:
        return None
    return model_config(path).get("num_hidden_layers") if path.is_dir() else None


def model_config(model_dir: Path) -> dict:
    """The saved model's transformer config (``config.json``); {} where it cannot be read."""
    from augsbert_ray.models import transformer_dir

    try:
        return json.loads((transformer_dir(Path(model_dir)) / "config.json").read_text(encoding="utf-8"))
    except Exception:  # a card never fails a job: its dimensions are left out
        return {}


def write_trained_card(model: str, model_dir: Path, base_model: str, training: TrainingFacts, *,
                       gold_train: int | None = None, silver: SilverFacts | None = None,
                       gold_repeat: int = 1, versions: dict | None = None, given: bool = False) -> Path:
    """Writes a training stage's card for the model it just saved, with what the stage knows.

    Args:
        model: which model (a key of ``ROLES``).
        model_dir: the saved model's folder.
        base_model: the configured starting model.
        training: how it was trained (``training_facts``).
        gold_train: gold (or target) pairs it trained on.
        silver: the silver pairs it trained on, where it did.
        gold_repeat: how many times a gold-only model counted each gold pair.
        versions: library versions (``versions.versions``).
        given: the model was used as given, not trained (``cross_encoder.train: false``).

    Returns:
        The card's path.
    """
    config = model_config(model_dir)
    card = CardData(model=model, base_model=base_model, path=str(model_dir), training=training,
                    base_model_hub=base_model_id(base_model), silver=silver, gold_repeat=gold_repeat,
                    gold={"train": gold_train} if gold_train is not None else {},
                    hidden_size=config.get("hidden_size"), layers=config.get("num_hidden_layers"),
                    versions=versions or {}, given=given)
    return write_card(model_dir, render_card(card))


def write_card(model_dir: Path, text: str) -> Path:
    """Writes ``README.md`` in ``model_dir`` under a new name, renamed into place (a hard-linked
    card elsewhere keeps its text)."""
    target = Path(model_dir) / CARD
    tmp = target.with_name(f".{CARD}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return target


def _dataset(cfg) -> tuple[str, tuple[str, ...]]:
    src = cfg.data.train
    if src.format == "hf":
        return f"Hugging Face dataset {src.path}", (src.path,)
    return f"{src.format} file {Path(src.path).name}", ()


def run_card(model: str, cfg, metrics, model_dir: Path, published_as: str = "") -> CardData | None:
    """The card of one of the job's trained models, from its config and the run's metrics so far.

    Args:
        model: ``cross_encoder``, ``gold_only``, ``target_gold`` or ``augsbert``.
        cfg: the job (as run: after the autopilot's choice).
        metrics: ``metrics.RunMetrics`` of the run so far.
        model_dir: the folder the card goes in.
        published_as: ``models/bi-encoder`` for the shipped copy.

    Returns:
        The card's data; None if the model's stage has not run in this job.
    """
    result = metrics.result(model)
    if result is None:
        return None
    gold = metrics.result("gold")
    gold_counts = {} if gold is None else {"train": gold.train, "dev": gold.dev, "test": gold.test}
    given = model == "cross_encoder" and bool(result.train.get("given"))
    if model == "cross_encoder":
        training = training_facts(cfg.cross_encoder, "bce", cfg.seed, cfg.training.precision, result.train,
                                  gold_counts.get("train"))
        base = cfg.cross_encoder.model
    else:
        task = (cfg.target.task or cfg.task) if model == "target_gold" else cfg.task
        training = training_facts(cfg.bi_encoder, resolved_objective(cfg.bi_encoder.objective, task), cfg.seed,
                                  cfg.training.precision, result.train, result.train_pairs)
        base = cfg.bi_encoder.model
    silver, mixed = None, cfg.target is None or cfg.target.mix_source_gold
    if model == "augsbert":
        candidates, labels = metrics.result("candidates"), metrics.result("silver")
        silver = SilverFacts(pairs=0 if labels is None else labels.silver, gold_repeat=cfg.bi_encoder.gold_repeat,
                             mixed_with_gold=mixed,
                             strategy=None if candidates is None else candidates.headline(),
                             top_k=None if candidates is None else candidates.top_k,
                             candidates=None if candidates is None else candidates.candidates,
                             labelled=None if labels is None else labels.labelled,
                             teacher=teacher_words(cfg, metrics),
                             calibration=cfg.labeling.calibration,
                             silver_first="phases" in result.train)
    dataset, hub = _dataset(cfg)
    config = model_config(model_dir)
    check, shipped = metrics.result("teacher_check"), metrics.result("ship")
    return CardData(model=model, base_model=base, path=str(model_dir), training=training,
                    base_model_hub=base_model_id(base), job=cfg.name,
                    task=cfg.task, metric=metrics.primary_metric, dataset=dataset, hub_datasets=hub,
                    gold=gold_counts, silver=silver, scores=metrics.scores,
                    gold_repeat=cfg.bi_encoder.gold_repeat if model == "gold_only" and mixed else 1,
                    teacher_check=None if check is None else check.model_dump(),
                    shipped=None if shipped is None else shipped.model_dump(), published_as=published_as,
                    hidden_size=config.get("hidden_size"), layers=config.get("num_hidden_layers"),
                    versions=metrics.versions, final=True, given=given)


def teacher_words(cfg, metrics) -> str:
    """The teacher of the silver labels, in words: trained by the job, or used as given."""
    base = base_model_id(cfg.cross_encoder.model) or cfg.cross_encoder.model
    teacher = metrics.result("cross_encoder")
    if teacher is not None and teacher.train.get("given"):
        return f"the job's cross-encoder (models/cross-encoder: {base}, used as given, not finetuned)"
    return f"the job's cross-encoder (models/cross-encoder, finetuned from {base})"


def publish_cards(cfg, root: Path, metrics, published: dict[str, str]) -> list[Path]:
    """Writes the card of every published model this job trained, up to date with ``metrics``.

    Args:
        cfg: the job.
        root: the run directory's local root.
        metrics: the run's metrics so far.
        published: training stage (or ``ship``) -> the model's folder in the run directory.

    Returns:
        The cards written.
    """
    written = []
    shipped = metrics.result("ship")
    for stage, rel in published.items():
        folder = root / rel
        model = shipped.shipped if stage == "ship" and shipped else stage
        if (stage == "ship" and not shipped) or not folder.is_dir():
            continue
        card = run_card(model, cfg, metrics, folder, published_as=rel if stage == "ship" else "")
        if card is not None:
            written.append(write_card(folder, render_card(card)))
    return written
