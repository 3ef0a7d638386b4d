"""A command that needs an extra which is not installed names the extra, in one line, exit 2.

Each command runs in a subprocess where an import hook makes one package look uninstalled
(importing it raises ``ModuleNotFoundError``, as it does without it), then runs the command's
real entry point with ``runpy``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: ``python -c HIDE PACKAGES MODULE ARGS...``: run ``python -m MODULE ARGS...`` with the
#: comma-separated top-level PACKAGES not importable.
HIDE = r"""
import runpy, sys

hidden = set(sys.argv[1].split(","))


class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Uninstalled())
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def run_without(packages: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HIDE, packages, *command],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def the_error_line(proc: subprocess.CompletedProcess) -> str:
    """The command's one error line (progress notes before it, such as serve's "starting...",
    are not errors); no traceback."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("packages", "command", "named", "extra"),
    [
        pytest.param(
            "fastapi", ["agentgym.cli", "serve", "Corridor-v0", "--port", "0"], "fastapi",
            "openenv", id="serve-without-fastapi",
        ),
        pytest.param(
            "openenv", ["agentgym.cli", "serve", "Corridor-v0", "--port", "0"], "openenv",
            "openenv", id="serve-without-openenv",
        ),
        pytest.param(
            "torch", ["agentgym.cli", "eval", "Corridor-v0", "--model", "some-model-folder"],
            "torch", "train", id="eval-model-without-torch",
        ),
        pytest.param(
            "transformers",
            ["agentgym.cli", "eval", "Corridor-v0", "--model", "some-model-folder"],
            "transformers", "train", id="eval-model-without-transformers",
        ),
        pytest.param(
            "httpx",
            ["agentgym.cli", "eval", "Corridor-v0", "--base-url", "http://127.0.0.1:9/v1"],
            "httpx", "eval", id="eval-server-without-httpx",
        ),
        pytest.param(
            "torch", ["trainers.gigpo.train", "--iterations", "1"], "torch", "train",
            id="train-without-torch",
        ),
    ],
)  # fmt: skip
def test_a_missing_extra_is_named_in_one_line(tmp_path, packages, command, named, extra):
    out_dir = [] if command[1] == "serve" else ["--out-dir", str(tmp_path / "out")]
    proc = run_without(packages, *command, *out_dir)
    line = the_error_line(proc)
    assert f"needs {named}, not installed" in line, line
    assert f'pip install "agentgym-envs[{extra}]"' in line and f'".[{extra}]"' in line, line
    assert "No module named" not in line, line


def test_the_trainers_optional_packages_are_named_with_their_extra(tmp_path):
    """peft is imported only for LoRA, after torch: its absence is named too."""
    proc = run_without(
        "peft", "trainers.gigpo.train", "--env", "AgentGym/Corridor-v0", "--iterations", "1",
        "--lora-rank", "4", "--num-groups", "1", "--group-size", "2", "--eval-every", "0",
        "--no-progress", "--no-tensorboard", "--no-plot", "--out-dir", str(tmp_path / "out"),
    )  # fmt: skip
    line = the_error_line(proc)
    assert "needs peft, not installed" in line and "agentgym-envs[train]" in line, line


def test_the_command_line_names_the_extra_of_an_import_without_a_guard_of_its_own(tmp_path):
    """The dispatcher's backstop: ``agentgym retrieval serve`` imports fastapi where it needs it,
    without a guard; the answer is still one line naming the command's extra."""
    pytest.importorskip("bm25s")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"id": "1", "contents": "a cat sat"}\n{"id": "2", "contents": "a dog ran"}\n'
    )
    index = tmp_path / "index"
    built = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "retrieval", "index", "--corpus", str(corpus),
         "--kind", "bm25", "--out", str(index)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    proc = run_without(
        "fastapi", "agentgym.cli", "retrieval", "serve", "--index", str(index), "--port", "0"
    )
    line = the_error_line(proc)
    assert "needs fastapi, not installed" in line and "agentgym-envs[retrieval]" in line, line


def test_a_module_no_extra_installs_is_left_to_raise():
    from agentgym.cli import extra_of

    assert extra_of("torch.nn", "eval") == "train"
    assert extra_of("fastapi", "serve") == "openenv" and extra_of("fastapi", "eval") == "eval"
    assert extra_of("no_such_module", "list") is None
