"""The docs stay true to the code: the generated settings reference is current, and every
relative link in the READMEs reaches a file (and a heading, where it names one)."""

import re
from pathlib import Path

from augsbert_ray.config.reference import DEFAULT_OUT, REGENERATE, reference

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted({ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / DEFAULT_OUT, *ROOT.glob("*/README.md")})
# [text](target): inline Markdown links; code spans are removed first, so `a](b)` in code is no link.
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lowercase, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.MULTILINE)}


def test_config_reference_is_current():
    current = (ROOT / DEFAULT_OUT).read_text(encoding="utf-8") if (ROOT / DEFAULT_OUT).is_file() else ""
    assert current == reference(), f"{DEFAULT_OUT} is not current: regenerate it with `{REGENERATE}`"


def test_every_relative_link_in_the_docs_resolves():
    assert (ROOT / "README.md").is_file()
    broken = []
    for doc in DOCS:
        if not doc.is_file():
            continue
        for target in LINK.findall(CODE.sub("", doc.read_text(encoding="utf-8"))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_install_pins_the_torch_ci_installs():
    # CI runs the README's test command; a pin changed in one place only would test another install.
    readme = re.findall(r'"torch==([\d.]+)" -e "\.\[cpu,test\]"', (ROOT / "README.md").read_text(encoding="utf-8"))
    ci = set(re.findall(r'"torch==([\d.]+)"', (ROOT / ".ci" / "run").read_text(encoding="utf-8")))
    assert readme and set(readme) == ci, f"README.md pins torch {sorted(set(readme))}, .ci/run {sorted(ci)}"
