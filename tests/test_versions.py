"""The installed libraries are within the ranges pyproject.toml declares.

The floors are the versions the suite was run on, and Ray's upper bound is where the engine's
use of Ray's private APIs was last checked: a run on another version is not a tested one,
so the suite says so first, by name, instead of failing somewhere inside Ray.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def declared() -> tuple[str, list[Requirement], dict[str, list[Requirement]]]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    extras = {name: [Requirement(r) for r in reqs] for name, reqs in project["optional-dependencies"].items()}
    return project["requires-python"], [Requirement(r) for r in project["dependencies"]], extras


def outside(requirements: list[Requirement], required: bool) -> list[str]:
    """One line per requirement whose installed version is outside its range (or, when
    ``required``, that is not installed)."""
    problems = []
    for req in requirements:
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            if required:
                problems.append(f"{req.name} is not installed (pyproject.toml requires {req.name}{req.specifier})")
            continue
        if not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name} {version} is outside the range pyproject.toml declares ({req.specifier})")
    return problems


def test_installed_versions_are_within_the_declared_ranges():
    python, core, extras = declared()
    problems = outside(core, required=True)
    for name, reqs in extras.items():  # an extra's package counts where it is installed
        problems += outside(reqs, required=False)
    here = ".".join(map(str, sys.version_info[:3]))
    if not SpecifierSet(python).contains(here):
        problems.append(f"Python {here} is outside requires-python ({python})")
    assert not problems, ("this environment is not one the project declares as tested:\n  " + "\n  ".join(problems)
                          + "\nInstall versions within the ranges, or test the new versions (for Ray: its private "
                            "APIs listed beside its requirement in pyproject.toml) and move the range in "
                            "pyproject.toml.")


def test_ray_is_bounded_above_at_the_next_minor_of_a_checked_version():
    _, core, _ = declared()
    ray = next(r for r in core if r.name == "ray")
    uppers = [Version(s.version) for s in ray.specifier if s.operator == "<"]
    floors = [Version(s.version) for s in ray.specifier if s.operator == ">="]
    assert len(uppers) == 1 and len(floors) == 1, f"ray needs a floor and an upper bound, got '{ray.specifier}'"
    assert (uppers[0].major, uppers[0].minor) == (floors[0].major, floors[0].minor + 1), (
        f"ray's range {ray.specifier} spans minors whose private APIs were not all checked")


def test_an_installed_version_outside_its_range_is_named():
    reqs = [Requirement("pytest>=999"), Requirement("no-such-package-here>=1")]
    assert outside(reqs, required=False) == [
        f"pytest {md.version('pytest')} is outside the range pyproject.toml declares (>=999)"]
    assert outside(reqs[1:], required=True) == [
        "no-such-package-here is not installed (pyproject.toml requires no-such-package-here>=1)"]
