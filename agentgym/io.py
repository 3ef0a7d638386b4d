"""Atomic file writes: a reader (or the next run after a kill) sees the old file or the whole new
one, never a part.

Every writer in agentgym goes through these helpers: the bytes go to a temporary file beside the
target (same folder, so the final rename never crosses a file system), are flushed to disk, and
``os.replace`` publishes them in one step. On any error, ``KeyboardInterrupt`` included, the
temporary file is removed and the target is left as it was. A process killed outright (SIGKILL,
power loss) can leave a hidden ``.NAME.*.tmp`` file beside the target, never a partial target.

- :func:`atomic_write_bytes`, :func:`atomic_write_text`, :func:`atomic_write_json`: whole contents.
- :func:`atomic_save_npy`: one array as ``.npy``.
- :func:`atomic_open`: a file object to stream into (``pickle.dump``, shard writers).
- :func:`atomic_path`: a temporary path for writers that only take a path (``faiss.write_index``,
  ``pyarrow.parquet.write_table``, ``matplotlib``'s ``savefig``).
- :func:`replace_dir`: publish a directory written beside its target (indexes, checkpoints).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy as np

__all__ = [
    "atomic_open",
    "atomic_path",
    "atomic_save_npy",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "replace_dir",
]


def _create_temp(path: Path) -> tuple[int, Path]:
    """Create an empty temporary file beside ``path``; return its descriptor and path.

    Unlike ``tempfile.mkstemp`` (always mode 0600), the file is created with mode 0666 less the
    umask, so the published file has the permissions a plain ``open(path, "w")`` would give it.
    """
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # a name already taken (1 in 4 billion): draw another
            continue


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path to write to; its file replaces ``path`` when the ``with`` block ends
    without an error, and is deleted when it raises.

    For writers that take a path, not a file object::

        with atomic_path(out) as tmp:
            faiss.write_index(index, str(tmp))

    The temporary file exists (empty) when the block starts, in ``path``'s folder; its name does
    not end with ``path``'s suffix, so pass the format to writers that guess it from the name.
    """
    path = Path(path)
    fd, tmp = _create_temp(path)
    os.close(fd)
    try:
        yield tmp
        _fsync_file(tmp)  # the data reaches the disk before the rename makes it visible
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None
) -> Iterator[IO[Any]]:
    """A file to stream into (``mode`` ``"wb"`` or ``"w"``); it appears at ``path`` only when the
    ``with`` block ends without an error.

    Text mode uses ``encoding`` (default UTF-8, whatever the locale says).

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "rows.txt"
    >>> with atomic_open(out, "w") as f:
    ...     _ = f.write("row 1\\n")
    ...     out.exists()  # nothing at the target until the block ends
    False
    >>> out.read_text()
    'row 1\\n'
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open writes a new file: mode must be 'wb' or 'w', not {mode!r}")
    path = Path(path)
    fd, tmp = _create_temp(path)
    try:
        text = mode == "w"
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if text else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` atomically (UTF-8 unless ``encoding`` says otherwise)."""
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike[str], value: Any, **dump_kwargs: Any) -> None:
    """Replace ``path`` with ``value`` as JSON atomically; ``dump_kwargs`` go to ``json.dumps``
    (``indent``, ``default``, ...). The text is built first, so a value that cannot be encoded
    raises before anything touches the disk.

    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "stats.json"
    >>> atomic_write_json(out, {"won": 3})
    >>> out.read_text()
    '{"won": 3}'
    >>> atomic_write_json(out, {"won": object()})
    Traceback (most recent call last):
    TypeError: Object of type object is not JSON serializable
    >>> out.read_text()  # the old file, whole
    '{"won": 3}'
    """
    atomic_write_text(path, json.dumps(value, **dump_kwargs))


def atomic_save_npy(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Replace ``path`` with ``array`` in ``.npy`` format atomically (no pickled objects)."""
    import numpy as np

    with atomic_open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


def _mkdir_mode(parent: Path) -> int:
    """The permission bits ``os.mkdir`` gives a new folder in ``parent`` (0777 less the umask).

    Read from a probe folder, not by swapping ``os.umask``: that would change the mask of every
    thread of the process for an instant.
    """
    while True:
        probe = parent / f".mode-probe-{secrets.token_hex(4)}.tmp"
        try:
            probe.mkdir()
        except FileExistsError:  # a name already taken: draw another
            continue
        try:
            return probe.stat().st_mode & 0o777
        finally:
            probe.rmdir()


def replace_dir(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    aside: str | os.PathLike[str] | None = None,
) -> None:
    """Publish the finished directory ``src`` (written beside ``dst``) at ``dst``, replacing what
    is there.

    A reader finds the old complete directory or the new one (for an instant between two
    renames, neither), never a half-written one. A directory cannot be renamed over a non-empty
    one, so an existing ``dst`` is first renamed to ``aside`` (default: a hidden ``.NAME.old-*``
    beside it) and removed once ``src`` is in place: a kill between the renames leaves the old
    directory whole under ``aside``, for a caller that knows the name to recover.

    ``dst`` gets the mode a plain ``mkdir`` would give it (0777 less the umask), whatever mode
    ``src`` was made with: ``tempfile.mkdtemp`` makes 0700 folders, which would hide a shared
    index or model from the rest of its group.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> staging = pathlib.Path(tempfile.mkdtemp(dir=root))  # written beside the target
    >>> _ = (staging / "index.bin").write_bytes(b"v2")
    >>> replace_dir(staging, root / "index")
    >>> sorted(p.name for p in root.iterdir()), (root / "index" / "index.bin").read_bytes()
    (['index'], b'v2')
    """
    src, dst = Path(src), Path(dst)
    os.chmod(src, _mkdir_mode(src.parent))
    if not dst.exists():
        os.replace(src, dst)
        return
    if aside is None:
        aside = dst.with_name(f".{dst.name}.old-{secrets.token_hex(4)}")
    aside = Path(aside)
    if aside.exists():  # left by an earlier kill with the same name: dst is the newer copy
        shutil.rmtree(aside)
    os.replace(dst, aside)
    os.replace(src, dst)
    shutil.rmtree(aside, ignore_errors=True)
