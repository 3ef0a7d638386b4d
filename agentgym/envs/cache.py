"""Where the env families keep their on-disk caches, and what happens when nothing can be written.

Every cache lives under ``$AGENTGYM_CACHE`` (default ``$XDG_CACHE_HOME/agentgym``, else
``~/.cache/agentgym``). A cache only saves time: when its folder cannot be written (a read-only
home, a container's read-only layer, a path through a regular file) the family computes what it
needs in memory or in a private temporary folder, and one warning line per folder says so.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir", "writable_cache_dir", "warn_unwritable"]

#: the environment variable naming the root of every agentgym cache
CACHE_ENV = "AGENTGYM_CACHE"

logger = logging.getLogger("agentgym")
_warned: set[str] = set()
_lock = threading.Lock()


def cache_dir(*parts: str) -> Path:
    """``$AGENTGYM_CACHE/<parts...>`` (default ``~/.cache/agentgym/<parts...>``); not created."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        base = Path(xdg) / "agentgym"
    return Path(base).expanduser().joinpath(*parts)


def warn_unwritable(folder: str | os.PathLike[str], what: str, exc: BaseException) -> None:
    """Log one warning line (once per folder and process) that ``what`` is not cached."""
    key = str(folder)
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    logger.warning(
        "agentgym: cannot write the cache folder %s (%s): %s is kept in memory, not cached; "
        "set %s to a writable folder to keep it",
        key,
        reason,
        what,
        CACHE_ENV,
    )


def writable_cache_dir(folder: str | os.PathLike[str], what: str) -> Path | None:
    """``folder``, created if needed, when a file can be written in it; else None, after one
    warning line naming ``what`` (the caller then keeps it in memory).

    Checked by writing a file rather than by permission bits, which do not stop root and do not
    see read-only mounts.
    """
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        warn_unwritable(path, what, exc)
        return None
    return path
