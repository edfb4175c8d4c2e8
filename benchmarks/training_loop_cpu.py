"""The training loop before and after pre-tokenised batches and device-kept losses, side by side.

"Before" is ``augsbert_ray/training/loop.py`` as it was at ``--before`` (a git revision, loaded
from git into this process), which tokenises each batch inside the recipe's ``loss`` and reads
each step's loss; "after" is the working tree's. Both train the same recipe on the same pairs
with the same seed, alternating (the machine may be shared), and their final weights are
compared. Per run: pairs/s in the loop, and the time per step outside the model's forward and
backward (tokenising, padding, copies, the optimizer), measured by timing every forward of the
model and every ``backward`` call.

    python benchmarks/training_loop_cpu.py --pairs 400 --batch 16 --rounds 2
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from provenance import provenance, write_result

REPO = Path(__file__).resolve().parents[1]


def before_loop(rev: str):
    """The loop module as it was at ``rev``."""
    src = subprocess.run(["git", "show", f"{rev}:augsbert_ray/training/loop.py"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="loop-before-")) / "loop_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("loop_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["loop_before"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class Timer:
    """Seconds spent in the model's forward passes and in ``backward`` calls."""

    def __init__(self):
        self.forward = self.backward = 0.0
        self._t0 = 0.0
        original = torch.Tensor.backward

        def timed_backward(tensor, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self.backward += time.perf_counter() - t0

        torch.Tensor.backward = timed_backward

    def watch(self, module: torch.nn.Module) -> None:
        module.register_forward_pre_hook(lambda *_: setattr(self, "_t0", time.perf_counter()))
        module.register_forward_hook(lambda *_: setattr(self, "forward", self.forward + time.perf_counter() - self._t0))


def run_once(loop, kind: str, model: str, s1, s2, labels, batch: int, timer: Timer) -> dict:
    from augsbert_ray.training.recipes import make_recipe

    recipe = make_recipe(kind, model=model, max_length=128)
    hp = loop.HParams(epochs=1, lr=2e-5, batch_size=batch, warmup_ratio=0.1, seed=1)
    # The loop before engine messages went through logging took a ``log`` callable.
    quiet = {"log": lambda _: None} if "log" in inspect.signature(loop.PairTrainer).parameters else {}
    trainer = loop.PairTrainer(recipe, s1, s2, labels, hp, name=kind, **quiet)
    timer.forward = timer.backward = 0.0
    timer.watch(trainer.module)
    trainer.run()
    stats = trainer.stats()
    outside = (stats["seconds"] - timer.forward - timer.backward) / stats["steps"]
    return {"pairs_per_s": stats["pairs_per_s"], "seconds": stats["seconds"], "steps": stats["steps"],
            "outside_ms_per_step": 1000 * outside, "forward_s": timer.forward, "backward_s": timer.backward,
            "weights": {k: v.clone() for k, v in trainer.module.state_dict().items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=400)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2, help="before/after runs per encoder, alternating")
    p.add_argument("--before", default="2f9d602", help="the git revision of the loop before")
    p.add_argument("--data-dir", default=os.environ.get("AUGSBERT_DATA_DIR", "../shared/data"))
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "training_loop_cpu")
    args = p.parse_args(argv)

    from augsbert_ray.bench.data import sentence_pairs
    from augsbert_ray.models import resolve_model
    from augsbert_ray.training import loop as after

    torch.set_num_threads(os.cpu_count() or 1)
    model = str(resolve_model("embedded"))
    s1, s2 = sentence_pairs(Path(args.data_dir), args.pairs)
    labels = np.random.default_rng(0).uniform(0, 1, len(s1)).astype(np.float32)
    loops = {"before": before_loop(args.before), "after": after}
    timer = Timer()
    runs: list[dict] = []
    load: list[float] = []
    for kind in ("cross_encoder", "bi_encoder"):
        for r in range(args.rounds):
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                load.append(os.getloadavg()[0])
                out = run_once(loops[side], kind, model, s1, s2, labels, args.batch, timer)
                out.update(kind=kind, side=side, round=r + 1, load=load[-1])
                runs.append(out)
                print(f"{kind} {side} round {r + 1}: {out['pairs_per_s']:.1f} pairs/s, "
                      f"{out['outside_ms_per_step']:.1f} ms/step outside forward/backward (load {load[-1]:.2f})",
                      flush=True)
    identical = {}
    for kind in ("cross_encoder", "bi_encoder"):
        a = next(x["weights"] for x in runs if x["kind"] == kind and x["side"] == "before")
        b = next(x["weights"] for x in runs if x["kind"] == kind and x["side"] == "after")
        identical[kind] = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    lines = ["# The training loop on CPU: before and after pre-tokenised batches", "",
             f"{args.pairs} STS benchmark pairs, batch {args.batch}, 1 epoch, the embedded MiniLM (max_length 128), "
             f"fp32, {torch.get_num_threads()} torch threads; before = `training/loop.py` at {args.before}, after = "
             "this tree; runs alternate.", "",
             "| encoder | loop | round | pairs/s | outside forward/backward, ms/step | forward+backward, ms/step "
             "| load avg (1 min) |", "|---|---|---:|---:|---:|---:|---:|"]
    for x in runs:
        fb = 1000 * (x["forward_s"] + x["backward_s"]) / x["steps"]
        lines.append(f"| {x['kind']} | {x['side']} | {x['round']} | {x['pairs_per_s']:.1f} | "
                     f"{x['outside_ms_per_step']:.1f} | {fb:.1f} | {x['load']:.2f} |")
    lines += ["", "Final weights, before vs after (same seed): "
              + ", ".join(f"{k} {'bit-identical' if v else 'DIFFERENT'}" for k, v in identical.items()) + ".", "",
              *provenance("benchmarks/training_loop_cpu.py", argv)]
    write_result(args.out, lines, {"runs": [{k: v for k, v in x.items() if k != "weights"} for x in runs],
                                   "identical_weights": identical, "pairs": args.pairs, "batch": args.batch,
                                   "before": args.before})
    print("\n".join(lines))
    return 0 if all(identical.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
