"""Build step of the package: the simulator's hot modules compiled to C extensions with mypyc.

Everything else (metadata, dependencies, packages) is in pyproject.toml; this file only adds the extension
modules (docs/architecture.md "Compiled modules"). The modules stay Python source: the same files run
interpreted with ``DYNOPLAN_PURE_PYTHON=1`` (at build time: build no extension; at run time: import the
sources even where extensions were built).

A compiled build writes ``mocker/_compiled_sources.json`` beside the extensions (the source tree for an
editable or ``--inplace`` build, else the wheel): the modules, the sha256 of each source as built, and
``compiled``; a pure build writes it into the source tree with ``compiled`` false. ``mocker/__init__.py``
reads it at import and falls back to the sources (with a warning) when a source no longer matches its
extension, so that an edited ``.py`` in an editable install is never shadowed by a stale ``.so``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import ClassVar

from setuptools import Distribution, Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError

ROOT = Path(__file__).resolve().parent
# The engine cores, the KV managers, the request state and records, the routers, the pass-time models and the fleet
# (its event loop, routing glue, disaggregated handoff and fixed-fleet replay): where a replay spends its time
# (bench/bench_trees.py). Left out: the modules holding a pydantic settings class (mocker/kv/tiers.py,
# mocker/fleet/config.py, mocker/transfer.py: mypyc refuses their Field(...) defaults) and the fleet package's
# __init__ (re-exports only), see docs/architecture.md "Compiled modules".
COMPILED = [
    "mocker/engine/__init__.py",
    "mocker/engine/base.py",
    "mocker/engine/sglang.py",
    "mocker/engine/timeline.py",
    "mocker/engine/vllm.py",
    "mocker/fleet/fleet.py",
    "mocker/fleet/handoff.py",
    "mocker/fleet/pools.py",
    "mocker/fleet/replay.py",
    "mocker/fleet/routing.py",
    "mocker/kv/__init__.py",
    "mocker/kv/events.py",
    "mocker/kv/kvbm.py",
    "mocker/kv/manager.py",
    "mocker/kv/radix.py",
    "mocker/records.py",
    "mocker/request.py",
    "mocker/routers.py",
    "mocker/timing.py",
]
MANIFEST = "_compiled_sources.json"


def module_name(path: str) -> str:
    """``mocker/engine/__init__.py`` -> ``mocker.engine``; ``mocker/kv/radix.py`` -> ``mocker.kv.radix``."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def write_manifest(compiled: bool, package_dir: Path) -> None:
    """Record what this build made in ``package_dir`` (the mocker package; read by mocker/__init__.py)."""
    modules = {
        module_name(p): {
            "path": p.removeprefix("mocker/"),
            "sha256": hashlib.sha256((ROOT / p).read_bytes()).hexdigest(),
        }
        for p in COMPILED
    }
    (package_dir / MANIFEST).write_text(
        json.dumps({"compiled": compiled, "modules": modules}, indent=1, sort_keys=True) + "\n"
    )


def cannot_compile() -> str | None:
    """Why the extensions cannot be built on this machine (None: they can): no C compiler (``$CC``, else the
    one Python was built with) or no Python headers."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc!r} not found; Debian: apt-get install gcc)"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.exists():
        return f"no Python headers ({header} not found; Debian: apt-get install python3.11-dev)"
    return None


def pure_build_note(why: str) -> None:
    """Say on stderr (pip shows it with -v; make's own build_ext prints it) that the sources will run."""
    print(
        f"dynoplan build: {why}: the simulator runs from its Python sources (slower; mocker.COMPILED is False)",
        file=sys.stderr,
    )


PURE = os.environ.get("DYNOPLAN_PURE_PYTHON") == "1"
if not PURE and (_why := cannot_compile()) is not None:  # as optional C speedups do: fall back, do not fail
    pure_build_note(_why)
    PURE = True
if PURE:  # the tree's extensions (an earlier in-place build) are not to be used any more
    write_manifest(False, ROOT / "mocker")


class MypycBuildExt(build_ext):
    """build_ext whose extensions are made by mypycify when the command runs, not each time setup.py is
    executed (pip runs it for the build requirements and the metadata as well; mypycify type-checks and
    generates the C, some seconds)."""

    _made: ClassVar[list[Extension]] = []

    def finalize_options(self) -> None:
        if not PURE and not MypycBuildExt._made:
            from mypyc.build import mypycify  # a build requirement (pyproject.toml [build-system])

            # group_name: the shared library is mocker__mypyc.*.so, not named after a hash of the module list
            MypycBuildExt._made = mypycify(COMPILED, opt_level="3", group_name="mocker")
        self.distribution.ext_modules = MypycBuildExt._made
        super().finalize_options()
        self.parallel = self.parallel or max(2, os.cpu_count() or 1)  # the C files two at a time or more

    def run(self) -> None:
        target = ROOT / "mocker" if self.inplace else Path(self.build_lib) / "mocker"
        try:
            super().run()
        except (CCompilerError, ExecError) as e:  # a compiler that cannot build them: the sources run
            if PURE:
                raise
            pure_build_note(f"compiling the hot modules failed ({e})")
            self.distribution.ext_modules = []
            write_manifest(False, ROOT / "mocker")
            if target != ROOT / "mocker":
                target.mkdir(parents=True, exist_ok=True)
                write_manifest(False, target)
            return
        if not PURE:  # beside the extensions just made: the source tree (editable, --inplace) or the wheel's tree
            write_manifest(True, target)


class PlatformDistribution(Distribution):
    """A distribution with extension modules (platform wheel, build_ext runs) unless DYNOPLAN_PURE_PYTHON=1."""

    def has_ext_modules(self) -> bool:
        return not PURE


setup(distclass=PlatformDistribution, cmdclass={"build_ext": MypycBuildExt})
