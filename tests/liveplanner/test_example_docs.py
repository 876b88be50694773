"""The live-scaling example's prose agrees with itself and with its load: docs/local-stack.md and the
example's README describe the scale-down the same way, and the stack file's comment names the load's prompt
length and the README's worker figures."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "live-scaling"


def _flat(path: Path) -> str:
    return " ".join(path.read_text().split())


def test_local_stack_doc_and_example_readme_describe_the_scale_down_alike():
    phrase = "the planner scales down in steps (orange marks, e.g. `agg 4→3`, then `agg 3→1`)"
    assert phrase in _flat(ROOT / "docs" / "local-stack.md")
    assert phrase in _flat(EXAMPLE / "README.md")


def test_stack_comment_names_the_loads_prompt_length_and_the_readmes_worker_figures():
    isl = {json.loads(line)["input_length"] for line in (EXAMPLE / "load.jsonl").read_text().splitlines() if line}
    assert isl == {1024}
    comment = " ".join(
        ln.lstrip("# ") for ln in (EXAMPLE / "stack.yaml").read_text().splitlines() if ln.startswith("#")
    )
    assert re.findall(r"(\d+)-token prompt", comment) == ["1024"], comment
    readme = _flat(EXAMPLE / "README.md")
    assert "one worker serves 4 req/s within the SLA, two serve 8 req/s and three serve 12 req/s" in readme
    assert "one worker serves 4 req/s, two serve 8 and three serve 12" in " ".join(comment.split()), comment
