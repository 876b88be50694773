"""The Helm chart's ``values.schema.json`` (its ``planner:`` and ``operator.settings:`` parts) and the
DynoPlanner CRD's typed planner fields, generated from the settings models
(:class:`~planner.core.config.PlannerConfig`, :class:`~planner.operator.settings.OperatorSettings`) by
:func:`dynoplan.settings.json_schema`, so a value helm or the apiserver accepts is one the operator accepts
field by field (the cross-field checks stay in the models and in the chart's ``dynoplan.validate``).

Run ``python -m planner.operator.schemas`` to rewrite the committed files, ``--check`` to exit 1 when one
differs from what the models give (``tests/operator/test_schemas.py`` checks the same). The rest of each file
(the chart's other values, the CRD's ``targetRef``/``services``/``metrics``/``status``, ...) is written by hand
and kept as it is.

Two flavours of one schema:

* JSON Schema draft-07 for helm: ``$ref`` inlined, ``anyOf [X, null]`` as ``type: [X, "null"]``, every
  default kept;
* Kubernetes structural OpenAPI v3.0 for the CRD: ``$ref`` inlined, ``anyOf [X, null]`` as
  ``nullable: true``, numeric exclusive bounds as ``minimum`` + ``exclusiveMinimum: true``, the int64 bound
  (``maximum: 2**63 - 1``) as ``format: int64``, and no defaults
  (the apiserver would write them into every object, overriding the operator's planner defaults) but
  ``mode``'s, as before.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from dynoplan.fields import MAX_INT64
from dynoplan.settings import json_schema
from planner.core.config import PlannerConfig, PoolLimits
from planner.operator.settings import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
VALUES_SCHEMA = REPO / "helm" / "dynoplan" / "values.schema.json"
CRDS = (
    REPO / "crds" / "dynoplan.dev_planners.yaml",
    REPO / "helm" / "dynoplan" / "crds" / "dynoplan.dev_planners.yaml",
)

CHART_SET_SETTINGS = ("namespace", "planner_defaults_file")
"""OperatorSettings the chart sets itself (the release namespace, the ``planner:`` ConfigMap): not values."""
CHART_SETTINGS: dict[str, dict[str, Any]] = {
    "prometheus_url": {
        "pattern": "^(https?://.+)?$",
        "default": "",
        "description": '"" = the chart\'s Prometheus, else an http(s) URL',
    },
    "worker_image": {"default": "", "description": '"" = image.repository:image.tag'},
    "peering_name": {
        "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        "maxLength": 63,
        "description": "a Kubernetes object name (the KopfPeering)",
    },
    "health_port": {"minimum": 1, "description": "the probes' port (cannot be off in the chart)"},
    "metrics_port": {"minimum": 1, "description": "scraped by Prometheus (cannot be off in the chart)"},
}
"""Where the chart is stricter than the operator (or means something of its own by ``""``), per setting."""
CRD_DEFAULTS = ("mode",)
"""PlannerConfig fields whose default the CRD states (the apiserver writes it into objects)."""


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """``node`` with every ``$ref`` replaced by its definition and ``title`` dropped."""
    if isinstance(node, list):
        return [_inline(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **rest}, defs)
    return {k: _inline(v, defs) for k, v in node.items() if k not in ("title", "$defs")}


def _nullable(node: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the non-null schema, True) of an ``anyOf [X, {"type": "null"}]`` node, else (node, False)."""
    any_of = node.get("anyOf")
    if any_of and len(any_of) == 2 and {"type": "null"} in any_of:
        inner = next(x for x in any_of if x != {"type": "null"})
        return {**inner, **{k: v for k, v in node.items() if k != "anyOf"}}, True
    return node, False


def helm_schema(cls: Any) -> dict[str, Any]:
    """The draft-07 JSON Schema of a settings class (see the module docstring)."""
    raw = json_schema(cls)

    def conv(node: Any) -> Any:
        if isinstance(node, list):
            return [conv(x) for x in node]
        if not isinstance(node, dict):
            return node
        node, null = _nullable(node)
        out = {k: conv(v) for k, v in node.items()}
        if null:
            out["type"] = [out["type"], "null"]
        return out

    return conv(_inline(raw, raw.get("$defs", {})))


def openapi_schema(cls: Any, keep_defaults: tuple[str, ...] = ()) -> dict[str, Any]:
    """The Kubernetes structural OpenAPI v3.0 schema of a settings class (see the module docstring);
    ``keep_defaults``: the top-level fields whose default is kept."""
    raw = json_schema(cls)

    def conv(node: Any, default_ok: bool, is_top: bool = False) -> Any:
        if isinstance(node, list):
            return [conv(x, False) for x in node]
        if not isinstance(node, dict):
            return node
        node, null = _nullable(node)
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "default" and not default_ok:
                continue
            if k in ("exclusiveMinimum", "exclusiveMaximum"):
                out["minimum" if k == "exclusiveMinimum" else "maximum"] = v
                out[k] = True
            elif k == "maximum" and v == MAX_INT64:
                # the int64 range itself: the apiserver decodes schema bounds as float64, where 2**63 - 1 is
                # not an integer (it refuses the object: "Maximum boundary value must be of type integer")
                out["format"] = "int64"
            elif k == "properties":
                out[k] = {name: conv(sub, is_top and name in keep_defaults) for name, sub in v.items()}
            else:
                out[k] = conv(v, False)
        if null:
            out["nullable"] = True
        return out

    return conv(_inline(raw, raw.get("$defs", {})), False, is_top=True)


def values_schema(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` (the chart's values schema) with ``planner`` and ``operator.settings`` generated."""
    out = copy.deepcopy(current)
    props = out["properties"]
    planner = helm_schema(PlannerConfig)
    planner.pop("description", None)
    planner["description"] = props["planner"].get("description", "")
    props["planner"] = planner
    settings = helm_schema(OperatorSettings)
    for name in CHART_SET_SETTINGS:
        settings["properties"].pop(name)
    for name, override in CHART_SETTINGS.items():
        settings["properties"][name].update(override)
    settings.pop("description", None)
    settings["description"] = props["operator"]["properties"]["settings"].get("description", "")
    props["operator"]["properties"]["settings"] = settings
    return out


def _planner_leaves() -> dict[tuple[str, ...], dict[str, Any]]:
    """CRD path under ``spec`` -> OpenAPI schema of the PlannerConfig field it sets (planner.operator.spec)."""
    from planner.operator.spec import SPEC_KEYS

    top = openapi_schema(PlannerConfig, CRD_DEFAULTS)["properties"]
    pool = openapi_schema(PoolLimits)["properties"]
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for path, key in SPEC_KEYS:
        name = next(
            (p for p in ("prefill", "decode", "agg") if key.startswith(p + "_") and key[len(p) + 1 :] in pool), None
        )
        out[path] = copy.deepcopy(pool[key[len(name) + 1 :]] if name else top[key])
    return out


def crd(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` (the DynoPlanner CRD) with each typed planner field of ``spec`` generated."""
    out = copy.deepcopy(current)
    for version in out["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        for path, leaf in _planner_leaves().items():
            node = spec
            for part in path[:-1]:
                node = node["properties"].setdefault(part, {"type": "object", "properties": {}})
            node["properties"][path[-1]] = leaf
    return out


def _crd_text(doc: dict[str, Any], old_text: str) -> str:
    """The CRD's YAML, after the comment lines that head ``old_text``."""
    lines = []
    for line in old_text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        lines.append(line)
    return "".join(lines) + yaml.safe_dump(doc, sort_keys=False, width=120, default_flow_style=None)


def generated() -> dict[Path, str]:
    """File -> the text it should have."""
    out: dict[Path, str] = {}
    out[VALUES_SCHEMA] = json.dumps(values_schema(json.loads(VALUES_SCHEMA.read_text())), indent=2) + "\n"
    for path in CRDS:
        text = path.read_text()
        out[path] = _crd_text(crd(yaml.safe_load(text)), text)
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the generated files (or with ``--check``, name those that differ and return 1)."""
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for path, text in generated().items():
        if path.read_text() != text:
            stale.append(path)
            if not check:
                path.write_text(text)
    for path in stale:
        print(f"{path.relative_to(REPO)}: {'differs from the settings models' if check else 'rewritten'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
