"""The import structure DESIGN.md describes, checked with import-linter on every test run.

The contracts live in pyproject.toml (``[tool.importlinter]``); ``lint-imports`` in a clone's
root checks the same ones by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> list[dict]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def test_the_design_rules_are_contracts():
    # the rules of DESIGN.md's dependency direction, so deleting one is a visible change here
    forbidden = {
        (tuple(c["source_modules"]), m.removesuffix(".**"))
        for c in _contracts()
        if c["type"] == "forbidden"
        for m in c["forbidden_modules"]
    }
    for source, target in [
        ("agentgym", "trainers"),
        ("agentgym.envs", "agentgym.wrappers"),
        ("agentgym.envs", "agentgym.algorithms"),
        ("agentgym.envs", "agentgym.integrations"),
        ("agentgym.envs", "agentgym.engine"),
        ("agentgym.envs", "agentgym.vector"),
        ("agentgym.algorithms", "agentgym.envs"),
    ]:
        assert ((source,), target) in forbidden, f"no contract keeps {source} off {target}"
    acyclic = [c for c in _contracts() if c["type"] == "acyclic_siblings"]
    assert acyclic and {"agentgym", "trainers"} <= set(acyclic[0]["ancestors"])


def test_lint_imports_passes():
    try:
        import importlinter  # noqa: F401
    except ImportError:
        pytest.fail('import-linter is not installed: pip install -e ".[dev]" (the dev extra)')
    env = dict(os.environ)
    # the clone's own packages, `trainers` included (it is not installed with the wheel)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",  # no cache folder written into the clone
            "--no-logo",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
