"""The ``augsbert bench`` verb's arguments, and the verb itself."""

from __future__ import annotations

import shlex


def add_parser(sub) -> None:
    """Adds ``bench`` to the CLI's subcommands."""
    from augsbert_ray.bench.suite import PARTS

    b = sub.add_parser(
        "bench", help="measure this cluster part by part, beside sentence-transformers, bm25s and the rest",
        description="Measure the cluster part by part, each beside its in-process peer on the same hardware: "
                    "labelling (1..N actors) vs CrossEncoder.predict, BM25 vs bm25s, semantic search vs "
                    "util.semantic_search, the training loop vs SentenceTransformer.fit, and the control-plane "
                    "ceiling (the labelling pipeline with a null scorer). Writes report.md, report.json and a plot "
                    "into --out, each part as soon as it ends.")
    b.add_argument("--quick", action="store_true", help="small sizes: a few minutes on a small CPU")
    b.add_argument("--out", default="bench", help="the output folder (default: ./bench)")
    b.add_argument("--model", default="embedded", help="the encoder of every part: embedded, a hub id or a folder")
    b.add_argument("--parts", nargs="+", default=list(PARTS), metavar="PART",
                   help=f"the parts to run (default: all): {', '.join(PARTS)}")
    b.add_argument("--address", help="Ray cluster address (else RAY_ADDRESS, else local)")
    b.add_argument("--data-dir", help="where the STS benchmark is (default: AUGSBERT_DATA_DIR; synthetic "
                                      "sentences without it)")
    b.add_argument("--verbose", action="store_true", help="show Ray's own messages")


def main(args, argv: list[str]) -> int:
    """Runs ``augsbert bench`` (``api.bench``) and prints where its report is."""
    from augsbert_ray.api import bench

    report = bench(args.out, quick=args.quick, model=args.model, parts=args.parts, address=args.address,
                   data_dir=args.data_dir, verbose=args.verbose, command="augsbert " + shlex.join(argv))
    failed = [p.part for p in report.parts if p.status == "failed"]
    print(f"bench report: {args.out}/report.md" + (f" (failed parts: {', '.join(failed)})" if failed else ""))
    return 1 if failed else 0
