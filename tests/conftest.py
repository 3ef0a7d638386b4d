"""Fixtures shared across the test tree: real benchmark data, unpacked once per session.

Real data lives in ../shared/data beside the repository (or $AGENTGYM_SHARED_DATA); tests that
need it skip cleanly when it is absent. Nothing from it is ever copied into the repository.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tarfile
import tempfile
from pathlib import Path

import pytest

# The user's own cache, as it was before the session pointed $AGENTGYM_CACHE elsewhere.
_user_cache = os.environ.get("AGENTGYM_CACHE")
_user_models: Path | None = None
_session_cache: str | None = None


def pytest_configure(config):
    """Keep the suite out of the user's caches: for the session, ``$AGENTGYM_CACHE`` (every
    agentgym cache, and the env of every subprocess a test starts) is a temporary folder,
    removed at the end."""
    global _session_cache, _user_models
    from agentgym.models import models_cache_dir

    # A shell starts background jobs (`cmd &`, nohup) with SIGINT ignored, and Python then
    # never installs its KeyboardInterrupt handler; every subprocess inherits the ignore. The
    # Ctrl-C tests (in-process, and SIGINT sent to an `agentgym eval` child) need it back.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # A worker of `-n N`: the controller already made the session's cache and set the
        # thread count, and the worker's environment inherited both.
        return
    if _xdist_workers(config) > 1:
        # N workers share the cores: torch, BLAS and FAISS in every worker and every
        # subprocess a test starts take one thread each, never N x cores (spinning threads
        # that wait for a descheduled sibling are many times slower, not faster).
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ["MKL_NUM_THREADS"] = "1"
    _user_models = models_cache_dir()
    _session_cache = tempfile.mkdtemp(prefix="agentgym-test-cache-")
    os.environ["AGENTGYM_CACHE"] = _session_cache
    _link_user_smollm2(Path(_session_cache) / "models")


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker more than the cores (many tests wait on a server or a subprocess
    they started: with one worker per core, 2 cores were 1.6 busy), at most 6 (each worker
    imports torch and transformers: about 1 GB)."""
    return min((os.cpu_count() or 1) + 1, 6)


def _xdist_workers(config) -> int:
    """How many pytest-xdist workers this run starts (0 without `-n`, or without xdist)."""
    workers = getattr(config.option, "numprocesses", None) or 0
    if workers in ("auto", "logical"):
        return pytest_xdist_auto_num_workers(config)
    return int(workers)


def _link_user_smollm2(session_models: Path) -> None:
    """A SmolLM2 conversion already in the user's cache is linked into the session's, so every
    path to it (fixtures, ``agentgym models get``, subprocesses) names the same folder and none
    converts it again (38 s of CPU); a finished conversion is only read, so the link never
    writes into the user's cache (and removing the session's cache removes the link only)."""
    from agentgym import models

    folder = models.KNOWN_MODELS["smollm2-135m"].folder
    user = _user_models / folder if _user_models is not None else None
    if user is None or not (user / models._DONE_MARKER).is_file():
        return
    session_models.mkdir(parents=True, exist_ok=True)
    (session_models / folder).symlink_to(user, target_is_directory=True)


def pytest_unconfigure(config):
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)
        if _user_cache is None:
            os.environ.pop("AGENTGYM_CACHE", None)
        else:
            os.environ["AGENTGYM_CACHE"] = _user_cache


def pytest_collection(session):
    """With ``-q`` pytest prints nothing until every test file is imported (torch, transformers,
    gradio: tens of seconds on a busy machine); say what is happening at once."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and config.option.verbose < 0 and not config.option.collectonly:
        reporter.write_line("collecting tests (importing torch, transformers, openenv) ...")


def pytest_collection_finish(session):
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and config.option.verbose < 0 and not config.option.collectonly:
        count = len(session.items)
        reporter.write_line(f"running {count} test{'s' if count != 1 else ''}")


# Fixtures whose tests run the real SmolLM2, or read real benchmark data: such tests carry the
# marker even where their file does not say so, so that -m "not realmodel" skips them all.
REALMODEL_FIXTURES = {"smollm2_path", "smollm2_policy", "smollm2_server"}
REALDATA_FIXTURES = {"alfworld_real_root", "webshop_real_data", "minilm_dir"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    _mark_by_fixtures(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # With -n N, the longest tests (the real model's, the trainer's) first: they then run
        # beside the many short ones instead of alone at the end. A stable sort, the same on
        # every worker.
        items.sort(key=lambda item: not _heavy(item))


def _heavy(item) -> bool:
    return item.get_closest_marker("realmodel") is not None or "tests/trainers/" in item.nodeid


def _mark_by_fixtures(items) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & REALMODEL_FIXTURES:
            item.add_marker(pytest.mark.realmodel)
        if used & REALDATA_FIXTURES:
            item.add_marker(pytest.mark.realdata)
        # with -n N (--dist loadgroup), one worker runs each group: the server starts once,
        # and the in-process model loads once
        if "smollm2_server" in used:
            item.add_marker(pytest.mark.xdist_group("smollm2_server"))
        elif "smollm2_policy" in used:
            item.add_marker(pytest.mark.xdist_group("smollm2_policy"))
    # With -n N, every test of a module that starts Ray runs on one worker, in file order as in
    # one process: one local Ray cluster at a time, and no test of such a module meets a Ray
    # that a module-scoped fixture left running (a SIGINT a test sends to its own process took
    # that process down while Ray ran in it).
    ray_modules = {item.path for item in items if _RAY_TEST.search(item.name)}
    for item in items:
        if item.path in ray_modules:
            item.add_marker(pytest.mark.xdist_group("ray"))


_RAY_TEST = re.compile(r"(?<![a-z])ray(?![a-z])", re.IGNORECASE)
"""a test name or parameter naming Ray ("test_ray_...", "[ray]", "[ray-llm]"), not "array"."""


SHARED_DATA = Path(
    os.environ.get(
        "AGENTGYM_SHARED_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
    )
)
ALFWORLD_ARCHIVES = SHARED_DATA / "alfworld"


def _alfworld_playable(name: str, data: bytes) -> bool:
    # alfworld's own filter: no movable/Sliced tasks, only games marked solvable
    return "movable" not in name and "Sliced" not in name and b'"solvable": true' in data[-64:]


@pytest.fixture(scope="session")
def alfworld_real_root(tmp_path_factory) -> Path:
    """An ALFWorld data root with all of valid_seen and the first few playable train games."""
    valid_seen = ALFWORLD_ARCHIVES / "json_2.1.1-valid_seen.tar.xz"
    train = ALFWORLD_ARCHIVES / "json_2.1.1-train.tar.xz"
    if not valid_seen.is_file():
        pytest.skip(f"ALFWorld archive {valid_seen} absent")
    root = tmp_path_factory.mktemp("alfworld")
    with tarfile.open(valid_seen, "r:xz") as tar:
        tar.extractall(root, filter="data")
    if train.is_file():
        kept = 0
        with tarfile.open(train, "r|xz") as tar:  # stream: stop after a few games
            for member in tar:
                if not member.name.endswith("game.tw-pddl"):
                    continue
                data = tar.extractfile(member).read()
                if not _alfworld_playable(member.name, data):
                    continue
                out = root / member.name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(data)
                kept += 1
                if kept == 3:
                    break
    return root


@pytest.fixture(scope="session")
def webshop_real_data(tmp_path_factory) -> Path:
    """``$WEBSHOP_DATA``: WebShop's 1000-product catalogue and its attribute file, unpacked."""
    import lzma

    archives = sorted((SHARED_DATA / "webshop").glob("*.json.xz"))
    if not any(a.name.startswith("items_shuffle_1000") for a in archives):
        pytest.skip(
            f"WebShop catalogue {SHARED_DATA / 'webshop'}/items_shuffle_1000.json.xz absent"
        )
    root = tmp_path_factory.mktemp("webshop")
    for archive in archives:
        (root / archive.name[: -len(".xz")]).write_bytes(lzma.decompress(archive.read_bytes()))
    return root


@pytest.fixture(scope="session")
def searchqa_files(tmp_path_factory) -> Path:
    """Search-R1-format files (corpus.jsonl, <split>.parquet) and a BM25 index folder of them.

    No real Search-R1 data ships in ../shared/data, so the real-data path of
    ``AgentGym/SearchQA-v0`` runs on the synthetic benchmark written in Search-R1's formats.
    """
    pytest.importorskip("pyarrow")
    pytest.importorskip("bm25s")
    from agentgym.envs.searchqa.synthetic import write_search_r1_files
    from agentgym.retrieval.build import build_index

    root = tmp_path_factory.mktemp("searchqa")
    write_search_r1_files(root)
    build_index(root / "corpus.jsonl", root / "bm25", kind="bm25", show_progress=False)
    return root


@pytest.fixture
def searchqa_real_data(searchqa_files, monkeypatch) -> Path:
    """``$SEARCHQA_DATA`` for ``AgentGym/SearchQA-v0``; sets ``$SEARCHQA_RETRIEVER`` for the test."""
    monkeypatch.setenv("SEARCHQA_RETRIEVER", str(searchqa_files / "bm25"))
    return searchqa_files / "test.parquet"


@pytest.fixture
def alfworld_real_data(alfworld_real_root) -> Path:
    """``$ALFWORLD_DATA`` for ``AgentGym/ALFWorld-v0``."""
    return alfworld_real_root


def real_data_fixture(family: str) -> str:
    """The fixture that gives a family's real data: ``<family>_real_data`` by convention. The
    variable it is set in is the family's own ``FAMILY.data_env_var``; a family with no such
    fixture plays the data that variable already points to, or is skipped."""
    return f"{family}_real_data"


@pytest.fixture
def make(request, monkeypatch):
    """``make(env_id)``: gym.make for the registry-wide tests, with real data unpacked from
    ../shared/data (or generated in the family's real format) where the id needs it; skips ids
    whose optional packages or real data are absent here."""
    import gymnasium as gym

    import agentgym
    from agentgym.family import family_spec

    def _make(env_id: str) -> gym.Env:
        e = agentgym.entry(env_id)
        if not e.available():
            pytest.skip(f"{env_id} needs {e.needs}")
        spec = family_spec(e.family)
        variable = spec.data_env_var if spec is not None else None
        if e.real_data and variable is not None:
            try:
                root = request.getfixturevalue(real_data_fixture(e.family))
            except pytest.FixtureLookupError:
                root = os.environ.get(variable)  # no fixture: the data the machine points to
                if root is None:
                    pytest.skip(
                        f"{env_id}: no {real_data_fixture(e.family)} fixture; ${variable} unset"
                    )
            monkeypatch.setenv(variable, str(root))
        try:
            return gym.make(env_id)
        except FileNotFoundError as exc:
            if e.real_data:
                pytest.skip(f"{env_id}: real data not found ({exc})")
            raise

    return _make


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct as a transformers folder; skips the test, naming the
    install command, when its package is absent. A conversion already in the user's cache is
    read in place through a link (never written); otherwise it is converted once into the
    session's cache."""
    from agentgym import models

    try:
        return models.model_path("smollm2-135m")
    except models.ModelNotAvailable as exc:
        pytest.skip(str(exc))
