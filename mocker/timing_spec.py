"""Timing specs: the text of :attr:`mocker.config.EngineConfig.timing`, parsed and checked in one place.

A timing spec names the pass-time source of an engine (:mod:`mocker.timing`):

* ``polynomial``: the reference mocker's baseline polynomial (:class:`mocker.timing.PolynomialTiming`);
* ``PATH.npz``: an engine timing profile (:class:`mocker.timing.NpzTiming`), which must exist and be a NumPy
  ``.npz`` archive (a zip of ``.npy`` arrays: a text or JSON file is refused as not one, whatever its name);
* ``aic:k=v,k=v``: AIConfigurator predictions sampled into a cached profile (:mod:`mocker.timing_aic`). Keys:
  ``model`` (Hugging Face id AIConfigurator knows; required), ``system`` (e.g. h200_sxm; required),
  ``backend`` (vllm, sglang, trtllm; default vllm), ``tp`` (positive integer; default 1), ``quant`` (GEMM
  quantisation; default bf16), ``version`` (database version; default latest).

A leaf module: it imports only the standard library and :mod:`dynoplan.errors`, so the engine settings, the
timing sources and the AIConfigurator sampler (which also runs as a script in a separate interpreter) all
parse specs here without importing one another.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from dynoplan.errors import AicSpecError

POLYNOMIAL = "polynomial"
AIC_PREFIX = "aic:"
SPEC_KEYS: tuple[str, ...] = ("model", "system", "backend", "tp", "quant", "version")
BACKENDS: tuple[str, ...] = ("vllm", "sglang", "trtllm")
EXPECTED = "expected 'polynomial', a path to a .npz profile or 'aic:model=...,system=...'"
NOT_NPZ = (
    "not a NumPy .npz archive; expected an engine timing profile (.npz), 'polynomial' or 'aic:model=...,system=...'"
)


def is_aic(timing: str) -> bool:
    """True for an ``aic:`` spec."""
    return timing.startswith(AIC_PREFIX)


def parse_aic_spec(timing: str) -> dict[str, Any]:
    """Parse ``aic:k=v,k=v`` into ``{model, system, backend, tp, quant, version}`` with the defaults of the
    module docstring applied (``tp`` an int, ``version`` None = latest). Raises :class:`AicSpecError` with one
    line ``timing='...': problem; problem`` naming every bad or missing key."""
    if not is_aic(timing):
        raise AicSpecError(f"timing={timing!r}: expected 'aic:model=...,system=...'")
    out: dict[str, Any] = {"backend": "vllm", "tp": 1, "quant": "bf16", "version": None}
    problems = []
    for part in filter(None, timing[len(AIC_PREFIX) :].split(",")):
        k, sep, v = part.partition("=")
        k, v = k.strip(), v.strip()
        if not sep or k not in SPEC_KEYS:
            problems.append(f"{part!r}: expected key=value with key one of {', '.join(SPEC_KEYS)}")
        elif k == "tp":
            if not v.isdigit() or int(v) <= 0:
                problems.append(f"tp={v!r}: expected a positive integer")
            else:
                out["tp"] = int(v)
        else:
            out[k] = v
    for k in ("model", "system"):
        if not out.get(k):
            problems.append(f"{k}: missing, e.g. aic:model=Qwen/Qwen3-8B,system=h200_sxm")
    if out["backend"] not in BACKENDS:
        problems.append(f"backend={out['backend']!r}: expected one of {', '.join(BACKENDS)}")
    if problems:
        raise AicSpecError(f"timing={timing!r}: " + "; ".join(problems))
    return out


_NPZ_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
"""The first bytes by which ``numpy.load`` takes a file for a .npz (zip) archive: a zip's local file header, or
the end-of-directory record of an empty zip. Any other file numpy reads as a ``.npy`` array or, failing that, as
a pickle, which it refuses in pickle's words (``Cannot load file containing pickled data``)."""


def _not_npz(path: str) -> bool:
    """True when the regular file ``path`` is not a NumPy .npz archive: it does not start as one
    (:data:`_NPZ_MAGIC`) or has no readable zip directory (a truncated download). False when it cannot be read:
    the loader names that error."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        return not (head.startswith(_NPZ_MAGIC) and zipfile.is_zipfile(path))
    except OSError:
        return False


def timing_spec_problems(timing: str) -> list[str]:
    """Every problem of a timing spec (empty when valid): an unknown form, a missing ``.npz`` file, a file that
    is not a NumPy .npz archive (a text or JSON file, whatever its name), or the bad keys of an ``aic:`` spec;
    each line ``timing='...': ...``."""
    if timing == POLYNOMIAL:
        return []
    if is_aic(timing):
        try:
            parse_aic_spec(timing)
        except AicSpecError as e:
            return e.problems
        return []
    if Path(timing).is_file():
        if _not_npz(timing):
            return [f"timing={timing!r}: {NOT_NPZ}"]
        if not timing.endswith(".npz"):  # the spec's grammar: a profile is named PATH.npz
            return [f"timing={timing!r}: a .npz archive named without .npz; {EXPECTED} (rename it to end in .npz)"]
        return []
    if Path(timing).is_dir():
        return [f"timing={timing!r}: is a directory; {EXPECTED}"]
    if timing.endswith(".npz"):
        return [f"timing={timing!r}: profile file not found"]
    return [f"timing={timing!r}: {EXPECTED}"]


__all__ = [
    "AIC_PREFIX",
    "BACKENDS",
    "EXPECTED",
    "NOT_NPZ",
    "POLYNOMIAL",
    "SPEC_KEYS",
    "is_aic",
    "parse_aic_spec",
    "timing_spec_problems",
]
