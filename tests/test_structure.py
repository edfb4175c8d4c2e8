"""The package's shape: no import cycles (function-level imports included), only the runtime
module starts or connects to Ray, and the layers below the engine (pre-flight checks, data
loading, the display, the scheduler) import nothing of it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "augsbert_ray"


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles():
    graph = _imports()
    # A package's __init__ importing its own submodules is how a package exposes them, not a cycle.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not d.startswith(name + ".")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def _imported_by(package: str, graph: dict[str, set[str]]) -> set[str]:
    """What the modules of ``package`` (a module or a subpackage) import from outside it (``graph``: ``_imports``)."""

    def inside(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    return {d for name, deps in graph.items() if inside(name) for d in deps if not inside(d)}


ENGINE = ("augsbert_ray.runner", "augsbert_ray.pipeline", "augsbert_ray.scheduler", "augsbert_ray.context",
          "augsbert_ray.workers", "augsbert_ray.stages", "augsbert_ray.labeling", "augsbert_ray.training",
          "augsbert_ray.candidates", "augsbert_ray.api", "augsbert_ray.cli")


def _engine(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == e or n.startswith(e + ".") for e in ENGINE))


def test_the_preflight_checks_and_the_data_loading_need_no_engine_and_no_cluster():
    assert _engine({"augsbert_ray.stages.gold", "augsbert_ray.errors"}) == ["augsbert_ray.stages.gold"]  # it sees one
    graph = _imports()
    for package in ("augsbert_ray.preflight", "augsbert_ray.loaders"):
        deps = _imported_by(package, graph)
        assert _engine(deps) == [], package
        # of the runtime, only what a local machine's resources are (no Ray started or joined)
        runtime = sorted(d for d in deps if d.startswith("augsbert_ray.runtime"))
        assert runtime in ([], ["augsbert_ray.runtime.resources"]), package


def test_the_display_and_the_scheduler_know_nothing_of_the_stages():
    graph = _imports()
    assert _engine(_imported_by("augsbert_ray.progress", graph)) == []
    assert _imported_by("augsbert_ray.scheduler", graph) <= {"augsbert_ray", "augsbert_ray.graph"}
    assert _imported_by("augsbert_ray.graph", graph) == set()


def test_only_the_runtime_starts_ray():
    starters = sorted(_module(p) for p in PACKAGE.rglob("*.py") if "ray.init(" in p.read_text(encoding="utf-8"))
    assert starters == ["augsbert_ray.runtime.cluster"]


def test_the_package_exports_the_api_alone_and_imports_it_only_when_used():
    import subprocess
    import sys

    probe = ("import sys, augsbert_ray as a; heavy = lambda: sorted(m for m in ('torch', 'ray', 'pyarrow', "
             "'transformers', 'augsbert_ray.api') if m in sys.modules); before = heavy(); a.run; "
             "print(a.__all__, before, heavy())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['load_job', 'run', 'label', 'bench'] [] ['augsbert_ray.api']"


def test_the_driver_imports_no_model_or_statistics_stack_to_run_a_job():
    """The driver plans, schedules and reports; the model work runs on Ray's workers, which import
    torch, transformers and scipy themselves. Every command would otherwise pay their imports."""
    import subprocess
    import sys

    probe = ("import sys, augsbert_ray.cli, augsbert_ray.api, augsbert_ray.pipeline, augsbert_ray.report; "
             "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers', 'scipy', 'scipy.stats') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_driver_runs_a_job_up_to_rays_start_without_the_model_or_statistics_stack(tiny_stsb, tiny_model,
                                                                                         tmp_path):
    """Everything a job does before Ray starts (its gold pairs and their baselines, the progress
    display's plan of each stage) is on the path to the first training: the import check above
    sees only module imports."""
    import json
    import subprocess
    import sys

    job = {"name": "probe", "run_dir": str(tmp_path / "run"),
           "data": {s: {"format": "stsb", "path": str(p)} for s, p in tiny_stsb.items()},
           "cross_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8},
           "bi_encoder": {"model": tiny_model, "epochs": 1, "batch_size": 8},
           "sampling": {"strategy": "bm25", "top_k": 2}}
    probe = ("import json, sys, augsbert_ray.runtime as rt\n"
             "from augsbert_ray.config import validate_tree\n"
             "from augsbert_ray.api import run\n"
             "class Reached(BaseException): pass\n"
             "def start_ray(*a, **k):\n"
             "    loaded = [m for m in ('torch', 'transformers', 'sentence_transformers', 'scipy', 'scipy.stats') "
             "if m in sys.modules]\n"
             "    open(sys.argv[2], 'w').write(json.dumps(loaded)); raise Reached\n"
             "rt.start_ray = start_ray\n"
             "try: run(validate_tree(json.loads(sys.argv[1])))\n"
             "except Reached: pass\n")
    seen = tmp_path / "loaded.json"  # the display may hold stdout: the probe writes a file
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(job), str(seen)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(seen.read_text()) == []
    assert (tmp_path / "run" / "stages" / "gold").is_dir()  # the gold stage ran before Ray would start


def test_production_code_never_imports_the_fault_injection_module():
    graph = _imports()
    assert "augsbert_ray.testing" in graph  # the check below looks at the right name
    assert sorted(name for name, deps in graph.items() if "augsbert_ray.testing" in deps) == []
