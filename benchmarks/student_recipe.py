"""The student's recipe: gold-only and AugSBERT bi-encoders for variants of how the student trains.

A job's silver labels are fixed once its teacher has labelled them; what the student does with
them (learning rate, epochs, batch size, calibrated labels, how much gold weighs against
silver) is cheap to vary. From a finished run directory's gold pairs and silver labels, trains
the job's student (a regression job's: cosine loss, Spearman) once per variant and seed, on
gold alone and on gold + silver as the job's stages build them, with the engine's own
training loop (in-process, no Ray: one process per trial, several at a time, so a GPU host
runs many small students at once), and writes each trial's dev and test scores and the share
of the gap to the teacher (on test) that AugSBERT closes.

    python benchmarks/student_recipe.py --run-dir runs/stsb-1k-student2 --model embedded \\
        --num-layers 2 --silver 1=efe4287c9b8ecf47 --silver 2=355fbeb735ebf9c0 \\
        --variant base: --variant lr5e-5:lr=5e-5 --variant iso:calibration=isotonic

A variant is ``NAME:key=value,...`` with keys ``lr``, ``epochs``, ``batch_size``,
``warmup_ratio``, ``calibration`` (none or isotonic: the silver labels mapped to the gold scale
on the teacher's dev predictions, as ``labeling.calibration`` does) and ``gold_repeat`` (gold
pairs appear this many times in AugSBERT's training set) and ``objective`` (the student's loss,
``bi_encoder.objective``'s names: cosine, cosent, angle, cosent-distill, angle-distill; every
variant's gold-only reference trains with cosine, so all are compared with the same one),
``order`` (``mixed``: gold and silver shuffled together, as the job trains; ``silver-first``: the
student trains on the silver pairs alone, then on the gold pairs, each pass with its own warmup
and decay, the second from the first's weights) and ``labels`` (``teacher``: the silver scores
as the job's teacher gave them; ``symmetric``: the mean of the teacher's scores of (a, b) and
(b, a), the second order scored here with the run's teacher, ``models/cross-encoder``). The
gold-only reference counts each gold pair ``gold_repeat`` times, as the job's does. Each
trial keeps its dev and test predictions, and every variant is compared with the first on test
by a paired bootstrap, seed by seed. ``--silver SEED=FINGERPRINT`` names
the silver stage each seed uses (a seed's semantic-search candidates depend on its gold-only
student); each trial writes its line to ``--out``.jsonl as soon as it ends, and ``--reuse`` takes
the trials already there (same variant, settings, seed and silver) instead of training them
again, so seeds can be run one at a time and the last run reports them all.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import time
import typing
from pathlib import Path

from augsbert_ray.config.encoders import Curriculum

KEYS = {"lr": float, "epochs": int, "batch_size": int, "warmup_ratio": float, "calibration": str, "gold_repeat": int,
        "objective": str, "order": str, "labels": str}
ORDERS = typing.get_args(Curriculum)  # the engine's bi_encoder.curriculum values
LABELS = ("teacher", "symmetric")
REFERENCE_OBJECTIVE = "cosine"  # what every gold-only reference trains with


def parse_variant(text: str, base: dict) -> tuple[str, dict]:
    """``NAME:key=value,...`` -> (name, settings over ``base``); unknown keys are named."""
    name, _, rest = text.partition(":")
    if not name:
        raise SystemExit(f"--variant {text!r}: a name is needed before ':'")
    settings = dict(base)
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in KEYS or not value:
            raise SystemExit(f"--variant {text!r}: '{item}' is not key=value with a key in {sorted(KEYS)}")
        settings[key] = KEYS[key](value)
    if settings["calibration"] not in ("none", "isotonic"):
        raise SystemExit(f"--variant {text!r}: calibration must be none or isotonic")
    if settings["order"] not in ORDERS:
        raise SystemExit(f"--variant {text!r}: order must be one of {', '.join(ORDERS)}")
    if settings["labels"] not in LABELS:
        raise SystemExit(f"--variant {text!r}: labels must be one of {', '.join(LABELS)}")
    from augsbert_ray.training.recipes import OBJECTIVES

    if settings["objective"] not in OBJECTIVES:
        raise SystemExit(f"--variant {text!r}: objective must be one of {', '.join(sorted(OBJECTIVES))}")
    return name, settings


def _pairs(table):
    from augsbert_ray import schema

    return (table.column(schema.SENTENCE1).to_pylist(), table.column(schema.SENTENCE2).to_pylist(),
            table.column(schema.LABEL).to_numpy().astype("float32"))


def trial(spec: dict) -> dict:
    """Trains one student (gold only, or gold + silver) and scores it on dev and test."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from scipy.stats import spearmanr

    from augsbert_ray import schema
    from augsbert_ray.evaluation import cosine_scores
    from augsbert_ray.stages.student import training_phases
    from augsbert_ray.training.loop import HParams, train_pairs
    from augsbert_ray.training.recipes import BiEncoderRecipe, unwrap

    torch.set_num_threads(spec["threads"])
    run = Path(spec["run_dir"])
    s = spec["settings"]
    silver = None
    if spec["silver"]:
        silver = pq.read_table(run / "stages" / "silver" / spec["silver"] / "silver.parquet")
        if s["calibration"] == "isotonic":
            from augsbert_ray.stages.silver import fit_calibration

            pred = pq.read_table(spec["teacher_predictions"])
            dev = np.asarray(pred.column("split").to_pylist()) == "dev"
            fitted = fit_calibration(pred.column("prediction").to_numpy()[dev], pred.column("label").to_numpy()[dev])
            i = silver.schema.get_field_index(schema.LABEL)
            silver = silver.set_column(i, silver.schema.field(i), pa.array(fitted(silver.column(i).to_numpy())))
        if s["labels"] == "symmetric":
            reverse = pq.read_table(spec["reverse"]).column("score").to_numpy()
            i = silver.schema.get_field_index(schema.LABEL)
            mean = (silver.column(i).to_numpy() + reverse) / 2
            silver = silver.set_column(i, silver.schema.field(i), pa.array(mean.astype("float32")))
    # The training sets exactly as the job's AugSBERT (or gold-only) stage builds them: one, or
    # with silver first the silver pairs alone and then the gold ones, each a training of its own.
    phases = training_phases(pq.read_table(run / "gold" / "train.parquet"), silver, "regression",
                             s["gold_repeat"], s["order"])
    hp = HParams(epochs=s["epochs"], lr=s["lr"], batch_size=s["batch_size"], warmup_ratio=s["warmup_ratio"],
                 seed=spec["seed"], length_grouping=50)
    t0, steps, model, num_layers = time.perf_counter(), 0, spec["model"], spec["num_layers"]
    with tempfile.TemporaryDirectory() as tmp:
        for k, train in enumerate(phases):
            s1, s2, y = _pairs(train)
            recipe = BiEncoderRecipe(model=model, max_length=128, num_layers=num_layers, objective=s["objective"])
            module, stats = train_pairs(recipe, s1, s2, y, hp, silver=schema.silver_flags(train),
                                        device=spec["device"], name=f"{spec['name']} ({k + 1}/{len(phases)})")
            steps += stats["steps"]
            if k + 1 < len(phases):  # the next phase starts from these weights, already cut to num_layers
                model, num_layers = os.path.join(tmp, f"phase{k + 1}"), None
                recipe.save(module, model)
    seconds = time.perf_counter() - t0
    train_rows = sum(t.num_rows for t in phases)
    scores, preds = {}, {}
    for split in ("dev", "test"):
        a, b, gold = _pairs(pq.read_table(run / "gold" / f"{split}.parquet"))
        with torch.no_grad():
            pred = cosine_scores(unwrap(module).st, a, b, 128)
        scores[split] = float(spearmanr(pred, gold).statistic * 100)
        preds[split] = [round(float(x), 6) for x in pred]
    return {"variant": spec["variant"], "seed": spec["seed"], "silver": bool(spec["silver"]), "settings": s,
            "train_pairs": train_rows, "steps": steps, "seconds": round(seconds, 1), **scores, "preds": preds}


def _gold_key(settings: dict, seed: int) -> tuple:
    """What a gold-only reference depends on: the optimisation settings, the gold count and the seed
    (rows written before the reference counted gold as AugSBERT does read as gold once)."""
    return (settings["lr"], settings["epochs"], settings["batch_size"], settings["warmup_ratio"],
            settings.get("gold_repeat", 1), seed)


def load_teacher(run_dir: Path, device: str) -> tuple:
    """The run's teacher (``models/cross-encoder``) as (model in fp32, eval mode; tokenizer)."""
    from augsbert_ray.models import load_cross_encoder
    from augsbert_ray.scoring import prepare_model

    model, tokenizer = load_cross_encoder(str(run_dir / "models" / "cross-encoder"), device=device)
    return prepare_model(model, "fp32", device), tokenizer


def reverse_scores(run_dir: Path, fingerprint: str, out: Path, device: str, teacher: tuple | None = None) -> Path:
    """The run's teacher's scores of each silver pair read the other way round, (b, a), in the
    silver file's order; written once beside ``out`` and reused."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from augsbert_ray import schema
    from augsbert_ray.scoring import score_pairs

    path = out.parent / f"{out.name}.reverse-{fingerprint}.parquet"
    if path.exists():
        return path
    silver = pq.read_table(run_dir / "stages" / "silver" / fingerprint / "silver.parquet")
    model, tokenizer = teacher or load_teacher(run_dir, device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        scores = score_pairs(model, tokenizer, silver.column(schema.SENTENCE2).to_pylist(),
                             silver.column(schema.SENTENCE1).to_pylist(), device=device)
    print(f"scored {silver.num_rows} silver pairs the other way round in {time.perf_counter() - t0:.0f} s", flush=True)
    pq.write_table(pa.table({"score": pa.array(scores, pa.float32())}), path)
    return path


def symmetric_teacher(run_dir: Path, device: str, teacher: tuple | None = None) -> dict:
    """The run's teacher on dev and test (Spearman x100), reading each pair as given and as the
    mean of both orders: whether the symmetric silver labels come from a better scorer."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from scipy.stats import spearmanr

    from augsbert_ray.scoring import score_pairs

    model, tokenizer = teacher or load_teacher(run_dir, device)
    result = {}
    for split in ("dev", "test"):
        a, b, gold = _pairs(pq.read_table(run_dir / "gold" / f"{split}.parquet"))
        with torch.inference_mode():
            ab, ba = (score_pairs(model, tokenizer, x, y, device=device) for x, y in ((a, b), (b, a)))
        result[split] = {"one_order": float(spearmanr(ab, gold).statistic * 100),
                         "both_orders": float(spearmanr((ab + ba) / 2, gold).statistic * 100),
                         "orders_agree": float(np.corrcoef(ab, ba)[0, 1])}
    return result


def _trial_key(trial: dict) -> str:
    """What makes two trials the same: a spec (``silver`` its fingerprint or None) or a row
    written to the .jsonl (``silver_fingerprint``)."""
    fingerprint = trial.get("silver_fingerprint", trial["silver"] if isinstance(trial["silver"], str) else None)
    return json.dumps([trial["variant"], trial["settings"], trial["seed"], fingerprint], sort_keys=True)


def _against_first(rows: list[dict], names: list[str], run_dir: Path, silver: bool = True) -> list[str]:
    """Each variant's AugSBERT (or, ``silver`` False, gold-only) student against the first
    variant's on test, seed by seed: the paired bootstrap's 90% interval of the difference in
    Spearman x100, the same test pairs resampled."""
    import pyarrow.parquet as pq

    from augsbert_ray.evaluation import paired_bootstrap

    gold = {split: pq.read_table(run_dir / "gold" / f"{split}.parquet").column("label").to_numpy()
            for split in ("dev", "test")}
    done = {(r["variant"], r["seed"]): r for r in rows if r["silver"] == silver and "error" not in r}
    lines = [f"Against {names[0]} on dev (where a recipe is chosen) and on test (paired bootstrap, 1,000 "
             "resamples, 90% interval of the difference):", ""]
    for name in names[1:]:
        for seed in sorted({s for _, s in done}):
            a, b = done.get((names[0], seed)), done.get((name, seed))
            if a is None or b is None:
                continue
            shown = []
            for split in ("dev", "test"):
                bs = paired_bootstrap("regression", a["preds"][split], b["preds"][split], gold[split])
                b[f"vs_first_{split}"] = bs
                shown.append(f"{split} {bs['difference']:+.2f} ({bs['low']:+.2f} to {bs['high']:+.2f})")
            lines.append(f"- {name}, seed {seed}: " + "; ".join(shown))
    return lines + [""]


def _run(spec: dict) -> dict:
    try:
        return trial(spec)
    except Exception as e:  # one failed trial is reported, the others go on
        return {"variant": spec["variant"], "seed": spec["seed"], "silver": bool(spec["silver"]), "error": repr(e)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True, help="a finished run of the job (gold/ and stages/)")
    p.add_argument("--model", default="embedded", help="the student's base model (name or path)")
    p.add_argument("--num-layers", type=int, help="keep the model's first N layers (the job's bi_encoder.num_layers)")
    p.add_argument("--silver", action="append", default=[], metavar="SEED=FINGERPRINT",
                   help="the silver stage (a folder under stages/silver) each seed's AugSBERT trains on")
    p.add_argument("--gold-only", metavar="SEED,SEED", help="instead: gold-only students alone, each variant with "
                   "its own objective, for these seeds (the objectives compared on gold without silver)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:key=value,...")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--teacher-test", type=float, help="the teacher's test score x100 (default: the run's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--procs", type=int, default=1, help="trials at a time")
    p.add_argument("--threads", type=int, default=1, help="torch threads per trial")
    p.add_argument("--out", default="benchmarks/results/student_recipe")
    p.add_argument("--reuse", action="store_true", help="take the trials already in --out.jsonl")
    args = p.parse_args(argv)

    from augsbert_ray.models import resolve_model

    base = {"lr": args.lr, "epochs": args.epochs, "batch_size": args.batch_size, "warmup_ratio": 0.1,
            "calibration": "none", "gold_repeat": 1, "objective": REFERENCE_OBJECTIVE, "order": "mixed",
            "labels": "teacher"}
    variants = dict(parse_variant(v, base) for v in (args.variant or ["base:"]))
    silver = dict(item.split("=", 1) for item in args.silver)
    if bool(silver) == bool(args.gold_only):
        raise SystemExit("give --silver SEED=FINGERPRINT (AugSBERT against gold only) or --gold-only SEEDS")
    # Gold-only students with the teacher's score given need no teacher in the run (--until gold)
    scored = args.run_dir / "stages" / "eval_cross_encoder"
    teacher_dir = next(scored.iterdir()) if scored.is_dir() else None
    teacher_test = args.teacher_test
    if teacher_test is None:
        if teacher_dir is None:
            raise SystemExit(f"{args.run_dir} has no scored teacher: give --teacher-test")
        teacher_test = json.loads((teacher_dir / "scores.json").read_text())["test"]["spearman"]
    common = {"run_dir": str(args.run_dir), "model": resolve_model(args.model), "num_layers": args.num_layers,
              "device": args.device, "threads": args.threads,
              "teacher_predictions": str(teacher_dir / "predictions.parquet") if teacher_dir else None}
    teacher_orders = None
    if any(s["labels"] == "symmetric" for s in variants.values()):
        teacher = load_teacher(args.run_dir, args.device)
        teacher_orders = symmetric_teacher(args.run_dir, args.device, teacher)
        print(f"the teacher, one order and both: {json.dumps(teacher_orders)}", flush=True)
        common["reverse"] = {fp: str(reverse_scores(args.run_dir, fp, Path(args.out), args.device, teacher))
                             for fp in silver.values()}
        del teacher  # the trials run in processes of their own
    specs, gold_keys = [], set()
    for name, s in variants.items():
        # Gold only: no silver to calibrate, order or relabel; gold counted as AugSBERT counts it.
        gold_settings = {**s, "calibration": "none", "order": "mixed", "labels": "teacher"}
        for seed in (args.gold_only or "").split(",") if args.gold_only else []:
            specs.append({**common, "variant": name, "settings": gold_settings,
                          "seed": int(seed), "silver": None, "name": f"{name} gold only"})
        for seed, fp in silver.items():
            reverse = common.get("reverse", {}).get(fp)
            specs.append({**common, "variant": name, "settings": s, "seed": int(seed), "silver": fp, "name": name,
                          "reverse": reverse})
            # Gold only depends on the optimisation settings and the gold count alone: one trial per set.
            key = _gold_key(s, int(seed))
            if key not in gold_keys:
                gold_keys.add(key)
                specs.append({**common, "variant": name, "settings": {**gold_settings, "objective": REFERENCE_OBJECTIVE},
                              "seed": int(seed), "silver": None, "name": f"{name} gold only", "reverse": None})
    specs.sort(key=lambda sp: sp["silver"] is None)  # the long trials first
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    if args.reuse and out.with_suffix(".jsonl").exists():
        done = {_trial_key(r): r for r in map(json.loads, out.with_suffix(".jsonl").read_text().splitlines())
                if "error" not in r}
        rows = [done[_trial_key(sp)] for sp in specs if _trial_key(sp) in done]
        specs = [sp for sp in specs if _trial_key(sp) not in done]
        print(f"{len(rows)} trials taken from {out.with_suffix('.jsonl')}; {len(specs)} to train", flush=True)
    with mp.get_context("spawn").Pool(args.procs) as pool, open(out.with_suffix(".jsonl"), "a") as log:
        for r in pool.imap_unordered(_run, specs):
            rows.append(r)
            log.write(json.dumps({**r, "silver_fingerprint": silver.get(str(r["seed"])) if r["silver"] else None})
                  + "\n")
            log.flush()
            shown = {k: v for k, v in r.items() if k != "preds"}
            print(f"[{time.perf_counter() - t0:6.0f}s] {len(rows)}/{len(specs)} {json.dumps(shown)}", flush=True)

    if args.gold_only:
        return _report_gold_only(rows, list(variants), args, out, teacher_test)
    gold = {_gold_key(r["settings"], r["seed"]): r for r in rows if not r["silver"] and "error" not in r}
    lines = [f"# Student recipe: {args.run_dir.name}", "",
             f"Spearman x100 on dev and test; the gap is the teacher ({teacher_test:.2f} on test) minus gold only "
             "trained with the same settings.", "",
             "| variant | settings | seed | gold only dev / test | AugSBERT dev / test | gap closed (test) | train s |",
             "|---|---|---:|---|---|---:|---:|"]
    for r in sorted((r for r in rows if r["silver"]), key=lambda r: (list(variants).index(r["variant"]), r["seed"])):
        if "error" in r:
            lines.append(f"| {r['variant']} | | {r['seed']} | | failed: {r['error']} | | |")
            continue
        s = r["settings"]
        g = gold.get(_gold_key(s, r["seed"]))
        closed = (r["test"] - g["test"]) / (teacher_test - g["test"]) * 100 if g else float("nan")
        r["gap_closed"] = closed
        desc = ", ".join(f"{k} {v}" for k, v in s.items())
        lines.append(f"| {r['variant']} | {desc} | {r['seed']} | {g['dev']:.2f} / {g['test']:.2f} | "
                     f"{r['dev']:.2f} / {r['test']:.2f} | {closed:.1f}% | {r['seconds']:.0f} |" if g else
                     f"| {r['variant']} | {desc} | {r['seed']} | | {r['dev']:.2f} / {r['test']:.2f} | | {r['seconds']:.0f} |")
    lines.append("")
    for name in variants:
        closed = [r["gap_closed"] for r in rows if r.get("variant") == name and r["silver"] and "gap_closed" in r]
        if closed:
            lines.append(f"- {name}: mean gap closed {sum(closed) / len(closed):.1f}% over {len(closed)} seed(s)")
    lines.append("")
    if teacher_orders:
        lines += ["The teacher reading each pair as given and as the mean of both orders (Spearman x100; r: the "
                  "Pearson correlation of the two orders' scores):", ""]
        lines += [f"- {split}: {t['one_order']:.2f} one order, {t['both_orders']:.2f} both (r {t['orders_agree']:.3f})"
                  for split, t in teacher_orders.items()] + [""]
    lines += _against_first(rows, list(variants), args.run_dir)
    _write(lines, rows, args, argv, out, teacher_test)
    return 0


def _report_gold_only(rows: list[dict], names: list[str], args, out: Path, teacher_test: float) -> int:
    lines = [f"# Gold-only students, variant by variant: {args.run_dir.name}", "",
             f"Spearman x100 of gold-only students, each variant trained with its own settings (the teacher: "
             f"{teacher_test:.2f} on test).", "",
             "| variant | settings | seed | dev | test | train s |", "|---|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (names.index(r["variant"]), r["seed"])):
        desc = ", ".join(f"{k} {v}" for k, v in r["settings"].items())
        lines.append(f"| {r['variant']} | {desc} | {r['seed']} | failed: {r['error']} | | |" if "error" in r else
                     f"| {r['variant']} | {desc} | {r['seed']} | {r['dev']:.2f} | {r['test']:.2f} | {r['seconds']:.0f} |")
    lines.append("")
    lines += _against_first(rows, names, args.run_dir, silver=False)
    _write(lines, rows, args, None, out, teacher_test)
    return 0


def _write(lines: list[str], rows: list[dict], args, argv, out: Path, teacher_test: float) -> None:
    try:
        from provenance import provenance

        import torch

        gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else ""
        lines += provenance("benchmarks/student_recipe.py", argv, machine=gpu)
    except Exception as e:  # the table matters more than its footer
        lines.append(f"(provenance unavailable: {e!r})")
    out.with_suffix(".md").write_text("\n".join(lines), encoding="utf-8")
    kept = [{k: v for k, v in r.items() if k != "preds"} for r in rows]  # predictions: in the .jsonl only
    out.with_suffix(".json").write_text(json.dumps({"teacher_test": teacher_test, "rows": kept}, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # the training loop's lines
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
