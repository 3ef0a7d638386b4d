"""What a user with a partial install sees: one line naming the extra, never a raw import error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import agentgym
from agentgym.envs import DISTRIBUTION, EnvEntry, MissingExtra

ROOT = Path(__file__).resolve().parents[1]


def test_missing_optional_package_names_the_extra():
    e = EnvEntry(
        "AgentGym/TestNeedsMissing-v0",
        "agentgym.envs.corridor:CorridorEnv",
        "corridor",
        needs=("agentgym_no_such_module", "numpy"),
        extra="alfworld",
    )
    gym.register(id=e.id, entry_point=e.make)
    try:
        assert not e.available() and e.missing() == ["agentgym_no_such_module"]
        with pytest.raises(MissingExtra) as info:
            gym.make(e.id)
        message = str(info.value)
        assert "\n" not in message
        assert f'pip install "{DISTRIBUTION}[alfworld]"' in message
        assert "agentgym_no_such_module" in message and "numpy" not in message
        assert isinstance(info.value, ImportError)  # callers catching ImportError still do
    finally:
        del gym.registry[e.id]


def test_every_id_with_optional_packages_names_its_extra():
    for e in agentgym.ENTRIES:
        if e.needs:
            assert e.extra, f"{e.id} needs {e.needs} but names no extra to install"


def test_distribution_name_is_ours_and_hints_use_it():
    text = (ROOT / "pyproject.toml").read_text()
    assert f'name = "{DISTRIBUTION}"' in text
    # no install hint anywhere points at the unrelated 'agentgym' project on the package index
    out = subprocess.run(
        [
            "git",
            "grep",
            "-n",
            "-E",
            r"pip install [\"']?agentgym\[",
            "--",
            "*.py",
            "*.md",
            "*.toml",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.stdout == "", out.stdout


def test_missing_extra_through_the_command_is_one_line(tmp_path):
    # a subprocess where textworld cannot be found: the CLI prints one line naming the extra
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import importlib.abc, sys\n"
        "class _Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('textworld', 'alfworld'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    import os

    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "play", "ALFWorld-Synthetic-v0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        input="",
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    assert f"{DISTRIBUTION}[alfworld]" in out.stderr


def test_wheel_ships_type_hints_and_only_the_library(tmp_path):
    """The built wheel holds agentgym (py.typed included, so type checkers read its hints) and
    no top-level ``trainers`` package, a generic name other distributions use."""
    import shutil
    import zipfile

    # build from a copy: an in-tree build would leave build/ and *.egg-info in the clone
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("agentgym", "trainers"):  # trainers/ is there, as in a clone, to be left out
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         str(src), "-w", str(tmp_path / "dist")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "agentgym/py.typed" in names
    assert not [n for n in names if n.split("/")[0] == "trainers"]
    # and nothing of the library is lost on the way (e.g. a subpackage without __init__.py)
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "agentgym").rglob("*.py")}
    assert modules <= names, sorted(modules - names)


@pytest.mark.parametrize(
    ("blocked", "code", "extra"),
    [
        ("ray", "GroupVectorEnv('AgentGym/Corridor-v0', 1, 2, backend='ray')", "ray"),
        ("trl", "import agentgym.integrations.trl as m; m._require_trl()", "trl"),
        ("openenv", "import agentgym.integrations.openenv", "openenv"),
        ("matplotlib", "from trainers.gigpo.plot import plot_history; plot_history([], 'x.png')",
         "train"),
    ],
)  # fmt: skip
def test_every_optional_import_reports_the_same_way(blocked, code, extra, tmp_path):
    # one error class and one hint, whichever part of the project needs the package
    script = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from agentgym import GroupVectorEnv\n"
        "from agentgym.extras import MissingExtra\n"
        f"try:\n    {code}\nexcept MissingExtra as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 1, out.stdout
    assert f'pip install "{DISTRIBUTION}[{extra}]"' in out.stdout
