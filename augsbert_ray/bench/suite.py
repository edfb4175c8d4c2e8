"""``augsbert bench``: every part in order, each written the moment it ends.

Parts: ``labelling`` (the Ray pipeline for 1..N actors vs ``CrossEncoder.predict``),
``bm25`` (Tantivy vs bm25s), ``semantic`` (Faiss exact and approximate vs
``util.semantic_search``), ``training`` (Ray Train vs ``SentenceTransformer.fit``, and a
stage's fixed cost) and ``control-plane`` (the labelling pipeline with a null scorer). A part
that fails is reported with its error and the others still run; ``report.json``,
``report.md`` and the plot in the output folder always hold what has been measured so far.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from augsbert_ray.bench import hardware, render
from augsbert_ray.bench.records import BenchReport, PartResult
from augsbert_ray.progress.ray_logs import describe_error

PARTS = ("labelling", "bm25", "semantic", "training", "control-plane")
TITLES = {"labelling": "Labelling: the Ray pipeline against CrossEncoder.predict",
          "bm25": "BM25: queries per second, the engine's Tantivy index against bm25s",
          "semantic": "Semantic search: Faiss exact and approximate against util.semantic_search",
          "training": "The training loop: Ray Train against SentenceTransformer.fit",
          "control-plane": "The control-plane ceiling: the labelling pipeline with a null scorer"}


@dataclass(frozen=True)
class Plan:
    """How much each part measures."""

    peer_pairs: int  # pairs each CrossEncoder.predict variant scores
    peer_batch: int  # the tuned peer's batch size
    pairs_per_actor: int  # pairs the pipeline labels per actor
    block_size: int  # pairs per shard (0: the engine's default for the device)
    max_cpu_actors: int  # most CPU actors tried
    bm25_docs: int | None  # sentences indexed, each a query (None: every STSb sentence)
    embed_sentences: int | None  # sentences embedded for semantic search (None: every one)
    embed_scale: int  # synthetic noisy copies of each embedding (see semantic.grow)
    queries: int
    train_pairs: int
    train_batch: int
    null_pairs: int  # pairs of the control-plane run
    null_block: int
    null_actors: int


def plan_for(quick: bool, gpu: bool, cpus: float) -> Plan:
    """The sizes of a quick or full run on a cluster with or without GPUs.

    Full mode's control plane is 10M pairs in 1,221 shards; quick mode's fits a few minutes of
    a small CPU with everything else.
    """
    if quick:
        return Plan(peer_pairs=4000 if gpu else 200, peer_batch=512 if gpu else 128,
                    pairs_per_actor=100_000 if gpu else 512, block_size=0 if gpu else 64, max_cpu_actors=2,
                    bm25_docs=4000, embed_sentences=500, embed_scale=20, queries=1000,
                    train_pairs=2048 if gpu else 64, train_batch=32 if gpu else 16,
                    null_pairs=200_000, null_block=200, null_actors=1)
    return Plan(peer_pairs=40_000 if gpu else 3000, peer_batch=512 if gpu else 256,
                pairs_per_actor=400_000 if gpu else 20_000, block_size=0, max_cpu_actors=8,
                bm25_docs=None, embed_sentences=None, embed_scale=20, queries=5000,
                train_pairs=20_000 if gpu else 1000, train_batch=64 if gpu else 16,
                null_pairs=10_000_000, null_block=8192, null_actors=max(1, min(4, int(cpus) // 4)))


class Bench:
    """One benchmark run writing into ``out`` (see ``run_bench``)."""

    def __init__(self, out: Path, report: BenchReport, log):
        self.out, self.report, self.log = out, report, log

    def write(self) -> None:
        """The report so far: JSON, Markdown and the plot (written under temporary names, then renamed)."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.report.load_average["now"] = hardware.load_average()
        name, note = render.plot(self.report, self.out)
        for path, text in (("report.json", json.dumps(self.report.to_dict(), indent=2, default=str)),
                           ("report.md", render.markdown(self.report, name, note))):
            tmp = self.out / f".{path}.tmp"
            tmp.write_text(text + "\n", encoding="utf-8")
            tmp.replace(self.out / path)

    def part(self, name: str, fn) -> PartResult:
        """Runs one part: its result is in the report whatever happens (an error is recorded,
        with its traceback in ``logs/``), and written."""
        result = PartResult(name, TITLES[name])
        self.report.put(result)
        t0 = time.perf_counter()
        self.log(f"[bench] {name}: started")
        try:
            fn(result)
        except (KeyboardInterrupt, SystemExit):
            result.status, result.error = "failed", "interrupted"
            raise
        except Exception as e:  # noqa: BLE001 - one part's failure must not stop the others
            result.status = "failed"
            result.error = describe_error(e)[:500]
            logs = self.out / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            (logs / f"{name}.traceback.txt").write_text(traceback.format_exc(), encoding="utf-8")
            self.log(f"[bench] {name}: FAILED ({result.error}); traceback in {logs / f'{name}.traceback.txt'}")
        finally:
            result.seconds = time.perf_counter() - t0
            self.write()
        if result.status == "ok":
            self.log(f"[bench] {name}: done in {result.seconds:.0f} s")
        return result


def run_bench(out: str | Path = "bench", *, quick: bool = False, model: str = "embedded", parts=PARTS, address=None,
              data_dir=None, verbose: bool = False, log=None, command: str | None = None) -> BenchReport:
    """Measures the cluster part by part, each beside its in-process peer (see the module docstring).

    Args:
        out: the folder for ``report.md``, ``report.json`` and the plot (created): new, empty
            or an earlier benchmark's, claimed while the benchmark runs (``run_lock.RunLock``);
            Ray's own messages and a failed part's traceback go to ``out/logs``.
        quick: small sizes, a few minutes on a small CPU.
        model: the encoder of every part: ``embedded``, a hub id or a local folder.
        parts: which of ``PARTS`` to run (always in ``PARTS``' order; one name, a list of them,
            or None for all).
        address: a Ray cluster address (default: ``RAY_ADDRESS``, else a local Ray).
        data_dir: where the STS benchmark is (an error where it is not there); default:
            ``AUGSBERT_DATA_DIR``, synthetic sentences where it is absent.
        verbose: show Ray's own messages.
        log: receives progress lines (default: the terminal).
        command: how the run was started, for the report (default: this call).

    Returns:
        The ``BenchReport`` (also in ``out/report.json``).

    Raises:
        AugSBERTError: an unknown part, a module a part needs that is not installed (the
            ``bench`` extra's peers, faiss), an address where no cluster answers, a
            ``data_dir`` without the STS benchmark, a model that cannot be loaded, an ``out``
            that cannot be written, holds files that are not a benchmark's or that another
            benchmark is writing, all before Ray starts.
    """
    from augsbert_ray.api_arguments import check_bench
    from augsbert_ray.bench import data
    from augsbert_ray.cluster_address import check, choose
    from augsbert_ray.errors import ConfigError
    from augsbert_ray.models import check_cross_encoder
    from augsbert_ray.preflight.optional_modules import bench_needs, require
    from augsbert_ray.run_lock import RunLock

    parts = check_bench(out, quick, model, parts, address, data_dir, verbose, log, command)
    parts = PARTS if parts is None else tuple(parts)
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise ConfigError("--parts", None, f"unknown part(s) {', '.join(unknown) or '(none given)'}; valid: "
                                           f"{', '.join(PARTS)}")
    require(bench_needs(parts), None)  # a peer not installed: refused now, not recorded as a failed part
    check(choose(None, None, address))  # an address where no cluster answers: ray.init would retry for minutes
    if data_dir is not None and not data.has_stsb(Path(data_dir)):
        raise ConfigError("--data-dir", None, f"{Path(data_dir).absolute()} holds no STS benchmark "
                                              "(stsb/sts-train.csv, sts-dev.csv and sts-test.csv): give the folder "
                                              "that holds stsb/, or leave --data-dir out")
    check_cross_encoder(model)  # a model that cannot load fails here, once, not in every part
    out = Path(out)
    check_output(out)
    with RunLock(out, shown=str(out), what="--out",
                 advice="one benchmark at a time can write a folder: wait for it to end, or name another --out"):
        check_output(out)  # as it is now that no other benchmark can change it
        return _run_bench(out, quick, model, parts, address, data_dir, verbose, log, command)


OWN_FILES = ("report.json", "report.md", "logs")  # and the plot, and the files written under temporary names


def check_output(out: Path) -> None:
    """``out`` can take the report: a folder that is new, empty, or a benchmark's own (its
    ``report.json`` is a benchmark report), so that no file of someone else's is overwritten.

    Raises:
        AugSBERTError: naming ``out`` and what is in the way.
    """
    from augsbert_ray.errors import AugSBERTError
    from augsbert_ray.run_lock import LOCK_NAME

    try:
        if not out.exists():
            return
        if not out.is_dir():
            raise AugSBERTError(f"--out {out}: is a file, not a folder; name a new or empty folder")
        names = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
    except OSError as e:
        raise AugSBERTError(f"--out {out}: cannot be read: {e.strerror or e}") from None
    if not names:
        return
    try:
        own = json.loads((out / "report.json").read_text(encoding="utf-8"))
        BenchReport.from_dict(own)
    except (OSError, ValueError, TypeError, AttributeError):
        own = None
    if not isinstance(own, dict):
        raise AugSBERTError(f"--out {out}: holds files that are not a benchmark's report ({', '.join(names[:5])}"
                            f"{', ...' if len(names) > 5 else ''}), which the report would overwrite; name a new or "
                            "empty folder")


def _run_bench(out: Path, quick: bool, model: str, parts, address, data_dir, verbose: bool, log,
               command: str | None) -> BenchReport:
    from augsbert_ray.bench import data
    from augsbert_ray.progress.ray_logs import RayOutput
    from augsbert_ray.runtime import start_ray, stop_ray

    sink = [log or (lambda line: print(line, file=sys.stderr, flush=True))]

    def say(line: str) -> None:
        sink[0](line)

    report = BenchReport(mode="quick" if quick else "full",
                         command=command or f"augsbert_ray.bench.run_bench({str(out)!r}, quick={quick}, model={model!r})",
                         started=f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", hardware=hardware.describe(),
                         versions=hardware.versions(), load_average={"start": hardware.load_average()})
    bench = Bench(out, report, say)
    bench.write()
    logs = out / "logs"
    with (_Uncaptured() if verbose else RayOutput(logs / "ray.log")) as captured:
        if captured is not None:
            if log is None:  # stdout and stderr now go to the log: progress goes to the terminal
                sink[0] = lambda line: print(line, file=captured.terminal, flush=True)
            captured.follow(say)
        try:
            cluster = start_ray(address, verbose=verbose, log_dir=None if verbose else logs)
            report.cluster = cluster.describe()
            say(f"[bench] Ray cluster: {report.cluster}" + ("" if verbose else f"; Ray's messages: {logs / 'ray.log'}"))
            _run_parts(bench, cluster, parts, model, data.data_dir(data_dir), quick, say)
        finally:
            stop_ray()
            bench.write()
    return report


class _Uncaptured:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _run_parts(bench: Bench, cluster, parts, model: str, where: Path, quick: bool, log) -> None:
    import tempfile

    import torch

    from augsbert_ray.bench import data

    plan = plan_for(quick, cluster.gpus > 0, cluster.cpus)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stsb = data.has_stsb(where)
    source = f"STS benchmark sentences from {where}" if stsb else "synthetic sentences (no STS benchmark found)"
    pairs_for = lambda n: data.sentence_pairs(where, n)  # noqa: E731
    work = Path(tempfile.mkdtemp(prefix="augsbert-bench-"))

    def labelling(result: PartResult) -> None:
        from augsbert_ray.bench import labeling as part
        from augsbert_ray.bench.model_dirs import saved_cross_encoder

        result.notes.append(f"Cross-encoder `{model}` saved once in fp32 and loaded by both; {source}.")
        model_dir = saved_cross_encoder(model, work / "cross-encoder")
        part.run(result, model_dir, pairs_for, cluster, plan, device, log, bench.write)

    def bm25(result: PartResult) -> None:
        from augsbert_ray.bench import bm25 as part

        docs = data.unique_sentences(where, limit=plan.bm25_docs)
        result.notes.append(f"{len(docs):,} {source.split(' from ')[0]}, one process, one thread each.")
        part.run(result, docs, 4, log)

    def semantic(result: PartResult) -> None:
        from augsbert_ray.bench import semantic as part
        from augsbert_ray.candidates.semantic import embed_texts
        from augsbert_ray.config import FaissConfig
        from augsbert_ray.models import load_bi_encoder

        texts = data.unique_sentences(where, limit=plan.embed_sentences)
        log(f"[bench] semantic: embedding {len(texts):,} sentences with `{model}` ({device})")
        base = embed_texts(load_bi_encoder(model, 128, device=device), texts, batch_size=64)
        emb = part.grow(base, plan.embed_scale, 0.3, seed=0)
        nlist = max(1, min(1024, len(emb) // 39))
        approximate = [(f"engine: Faiss IVF (nlist {nlist}, nprobe 16)",
                        FaissConfig(index="ivf", ivf_nlist=nlist, ivf_nprobe=16, use_gpu=False)),
                       ("engine: Faiss HNSW (M 32, efSearch 128)",
                        FaissConfig(index="hnsw", hnsw_m=32, hnsw_ef_search=128, use_gpu=False))]
        result.notes.append(f"{len(emb):,} rows: {len(texts):,} {source.split(' from ')[0]} embedded by `{model}`"
                            + (f" and {plan.embed_scale - 1} synthetic noisy copies of each (noise norm 0.3)"
                               if plan.embed_scale > 1 else "") + "; queries are corpus rows, top-3 other rows each.")
        part.run(result, emb, 3, plan.queries, approximate, log, use_gpu=device == "cuda")

    def training(result: PartResult) -> None:
        from augsbert_ray.bench import training as part

        result.notes.append(f"Bi-encoder `{model}`, {source}, random labels in [0, 1], 1 epoch.")
        part.run(result, model, pairs_for, plan, cluster, device, log, bench.write)

    def control_plane(result: PartResult) -> None:
        from augsbert_ray.bench import control_plane as part

        lab = bench.report.part("labelling")
        per = (lab.data.get("per_actor_steady") or {}) if lab else {}
        rate = per.get("1")
        what = f"{lab.data.get('device', 'CPU')} actor" if lab else "actor"
        result.notes.append("Every pair goes through labeling.label_shards (as `augsbert label`) with the actors' "
                            "scorer replaced by one that does no model work; the shards are made in memory.")
        part.run(result, data.unique_sentences(where, limit=20_000), plan, cluster, (what, rate), log)

    run = {"labelling": labelling, "bm25": bm25, "semantic": semantic, "training": training,
           "control-plane": control_plane}
    for name in PARTS:
        if name in parts:
            bench.part(name, run[name])
