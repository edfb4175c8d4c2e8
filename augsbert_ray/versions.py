"""The versions of the libraries a result depends on, recorded beside it (metrics, model
cards, benchmark results)."""

from __future__ import annotations

import platform


def versions() -> dict[str, str]:
    """Versions of the libraries a result depends on ("absent" for one not installed)."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("ray", "torch", "transformers", "sentence-transformers", "pyarrow"):
        try:
            out[name.replace("-", "_")] = md.version(name)
        except md.PackageNotFoundError:
            out[name.replace("-", "_")] = "absent"
    out["machine"] = f"{platform.machine()} {platform.processor() or ''}".strip()
    return out
