"""mocker: simulated LLM inference engines (vLLM, SGLang, TensorRT-LLM schedulers with KV-cache state).

One core, several drivers: the scheduler and KV code take ``now_ms`` as an argument and never read a
clock. The virtual-time fleet (offline replay) and the live worker server (wall clock) drive it.

:data:`COMPILED` tells whether the simulator's hot modules run as mypyc-compiled extensions (built by
setup.py; docs/architecture.md "Compiled modules"). They run from their Python sources instead, all of them
together, when ``DYNOPLAN_PURE_PYTHON=1`` is set, when the build compiled nothing, or when a source differs
from the one its extension was built from (an edit after ``pip install -e .``: a warning says to rebuild).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from pathlib import Path
from types import ModuleType

import dynoplan  # noqa: F401  (first: its process defaults precede any numpy import, dynoplan/__init__.py)

__all__ = ["COMPILED", "__version__"]
__version__ = "0.1.0"

_HERE = Path(__file__).resolve().parent
_MANIFEST = _HERE / "_compiled_sources.json"


class _SourceFinder:
    """Meta-path finder that imports the listed modules from their ``.py`` files, ahead of any extension."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        src = self.sources.get(fullname)
        if src is None:
            return None
        pkg = [str(src.parent)] if src.name == "__init__.py" else None
        return importlib.util.spec_from_file_location(fullname, src, submodule_search_locations=pkg)


def _select_compiled() -> bool:
    """True when the compiled extensions are to be imported; otherwise installs :class:`_SourceFinder`."""
    try:
        manifest = json.loads(_MANIFEST.read_text())
    except FileNotFoundError:  # no build recorded (a checkout on PYTHONPATH): the import system's choice
        return False
    sources = {name: _HERE / m["path"] for name, m in manifest["modules"].items()}
    ok = bool(manifest["compiled"]) and os.environ.get("DYNOPLAN_PURE_PYTHON") != "1"
    if ok:
        stale = [
            m["path"]
            for m in manifest["modules"].values()
            if hashlib.sha256((_HERE / m["path"]).read_bytes()).hexdigest() != m["sha256"]
        ]
        missing = [p.name for p in sources.values() if not (p.parent / (p.stem + EXTENSION_SUFFIXES[0])).exists()]
        if stale or missing:
            why = f"mocker/{', mocker/'.join(stale)} changed since the build" if stale else f"{missing[0]} not built"
            warnings.warn(
                f"mocker: compiled modules not used ({why}); running the Python sources. Rebuild with "
                "`pip install -e .` (or set DYNOPLAN_PURE_PYTHON=1 to silence this)",
                RuntimeWarning,
                stacklevel=2,
            )
            ok = False
    if not ok:
        sys.meta_path.insert(0, _SourceFinder(sources))
    return ok


COMPILED: bool = _select_compiled()
"""Whether the modules of setup.py COMPILED (mocker.engine, mocker.kv but tiers, mocker.request, mocker.routers,
mocker.timing, mocker.fleet but config) are compiled extensions."""
