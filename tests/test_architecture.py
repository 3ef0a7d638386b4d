"""The import structure DESIGN.md describes, checked with import-linter on every test run.

The contracts live in pyproject.toml (``[tool.importlinter]``); ``lint-imports`` in a clone's
root checks the same ones by hand.
"""

from __future__ import annotations

import ast
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


def test_code_built_on_the_library_is_held_to_its_public_api():
    # DESIGN.md: trainers/ and agentgym/integrations/ -> agentgym public API only
    public = [
        c
        for c in _contracts()
        if c["type"] == "forbidden"
        and {"trainers", "agentgym.integrations"} <= set(c["source_modules"])
    ]
    assert public, "no contract keeps trainers/ and agentgym/integrations/ on the public API"
    internals = set(public[0]["forbidden_modules"])
    assert {"agentgym.envs.*", "agentgym.vector.*", "agentgym.eval"} <= internals
    assert public[0].get("allow_indirect_imports") is True  # the public API may use internals
    assert any(
        c["type"] == "private_modules" and not c.get("packages_with_private_modules")
        for c in _contracts()
    ), "no contract keeps private (_name) modules inside their package"


def _private_names_imported(source: str, path: Path) -> list[str]:
    """``from agentgym.X import _name`` in ``source`` (the file at ``path``) where X is not the
    file's own package."""
    own = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if not node.module.startswith("agentgym") or node.module.startswith(own + "."):
            continue
        found += [
            f"{node.module}.{a.name}"
            for a in node.names
            if a.name.startswith("_") and not a.name.startswith("__")
        ]
    return found


@pytest.mark.parametrize("folder", ["trainers", "agentgym/integrations"])
def test_no_private_names_are_imported_from_the_library(folder):
    # import-linter sees modules, not names: a private helper (agentgym.x._helper) is checked here
    bad = {
        str(p.relative_to(ROOT)): names
        for p in sorted((ROOT / folder).rglob("*.py"))
        if (names := _private_names_imported(p.read_text(), p))
    }
    assert not bad, f"private names of agentgym imported: {bad}"
    # (and the check can fail)
    source = "from agentgym.core import _hidden, TextEnv\nfrom agentgym.io import _fsync_file\n"
    assert _private_names_imported(source, ROOT / folder / "x.py") == [
        "agentgym.core._hidden",
        "agentgym.io._fsync_file",
    ]


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


def _code_strings(path: Path) -> set[str]:
    """The string constants of ``path``'s code, docstrings left out."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    }


def test_the_trainer_never_names_a_family():
    # what differs between families is declared by each (FAMILY: lists_actions, llm_judge,
    # trainer_defaults...) and read through agentgym.family, never tested by name in trainers/
    from agentgym.family import family_names

    names = set(family_names()) | {"search"}  # (an older name of searchqa's prompt)
    bad = {
        str(p.relative_to(ROOT)): sorted(found)
        for p in sorted((ROOT / "trainers").rglob("*.py"))
        if (found := _code_strings(p) & names)
    }
    assert not bad, f"trainers/ names env families: {bad}"
