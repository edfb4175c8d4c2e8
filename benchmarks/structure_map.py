"""The package's structure as Markdown: modules and lines, who imports whom, where the job
config is read.

Run it on two checkouts to compare a restructuring before and after:

    python benchmarks/structure_map.py --root . --out benchmarks/results/structure_after.md

Lines are counted as code, comment/docstring and blank (``tokenize``). Imports are those of
``augsbert_ray`` modules (function-level ones included), tabled between groups (a subpackage
counts as one group). "Reads the config" counts attribute reads on names
bound to the job config (``cfg``, ``job``, ``config``) and on ``settings``/``params`` views.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from collections import Counter, defaultdict
from pathlib import Path

CONFIG_NAMES = {"cfg", "job", "config"}
VIEW_NAMES = {"settings", "params"}


def module_name(path: Path, package: Path) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def group_of(module: str) -> str:
    """``augsbert_ray.stages.gold`` -> ``stages``; top-level modules are their own group."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(package)"


def line_kinds(source: str) -> Counter:
    """Lines of code, of comments or docstrings, and blank ones."""
    kinds: dict[int, str] = {}
    lines = source.splitlines()
    for i, text in enumerate(lines, 1):
        kinds[i] = "blank" if not text.strip() else "code"
    prev = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            if not lines[tok.start[0] - 1][: tok.start[1]].strip():
                kinds[tok.start[0]] = "comment"
        elif tok.type == tokenize.STRING and prev in (None, tokenize.INDENT, tokenize.NEWLINE, tokenize.DEDENT,
                                                       tokenize.NL):
            for n in range(tok.start[0], tok.end[0] + 1):  # a bare string statement: a docstring
                kinds[n] = "comment"
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            prev = tok.type
    return Counter(kinds.values())


def imports_of(tree: ast.AST, modules: set[str], own: str) -> set[str]:
    deps = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            # ``from augsbert_ray import schema`` imports the module, not the package's namespace
            targets = [s for s in subs if s in modules] or [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        deps |= {t for t in targets if t in modules and t != own}
    return deps


def config_reads(tree: ast.AST) -> int:
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in CONFIG_NAMES | VIEW_NAMES:
                n += 1
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "cfg":  # runner.cfg.x, self.cfg.x
                n += 1
    return n


def analyse(root: Path) -> dict:
    package = root / "augsbert_ray"
    paths = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    rows, edges = {}, defaultdict(set)
    for name, path in paths.items():
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
        kinds = line_kinds(source)
        deps = imports_of(tree, set(paths), name)
        rows[name] = {"lines": sum(kinds.values()), "code": kinds["code"], "comment": kinds["comment"],
                      "config_reads": config_reads(tree), "imports": sorted(deps)}
        for dep in deps:
            a, b = group_of(name), group_of(dep)
            if a != b:
                edges[a].add(b)
    return {"modules": rows, "edges": {k: sorted(v) for k, v in sorted(edges.items())}}


def render(data: dict, title: str) -> str:
    mods = data["modules"]
    total = sum(m["lines"] for m in mods.values())
    comment = sum(m["comment"] for m in mods.values())
    big = [n for n, m in mods.items() if m["lines"] > 400]
    out = [f"# {title}", "",
           f"{len(mods)} modules, {total:,} lines ({comment / max(total, 1):.0%} comments and docstrings); "
           f"modules over 400 lines: {', '.join(f'`{b}`' for b in big) or 'none'}.", "",
           "## Who imports whom (groups; a subpackage is one group)", "",
           "| group | imports | imported by |", "|---|---|---|"]
    users = defaultdict(set)
    for a, bs in data["edges"].items():
        for b in bs:
            users[b].add(a)
    for g in sorted(set(data["edges"]) | set(users)):
        out.append(f"| `{g}` | {', '.join(data['edges'].get(g, []))} | {', '.join(sorted(users[g]))} |")
    out += ["", "## Modules", "",
            "| module | lines | code | comments | config reads | imports (package modules) |",
            "|---|---:|---:|---:|---:|---|"]
    for name, m in mods.items():
        short = [i.removeprefix("augsbert_ray.") for i in m["imports"]]
        out.append(f"| `{name.removeprefix('augsbert_ray.') or 'augsbert_ray'}` | {m['lines']} | {m['code']} | "
                   f"{m['comment']} | {m['config_reads']} | {', '.join(short)} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="a checkout of the project")
    ap.add_argument("--out", required=True, help="Markdown file to write")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    root = Path(args.root).resolve()
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown commit"
    text = render(analyse(root), args.title or f"Package structure at {commit}")
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
