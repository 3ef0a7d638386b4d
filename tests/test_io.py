"""agentgym.io: a writer that fails or is killed never leaves a partial target."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from agentgym.io import (
    atomic_open,
    atomic_path,
    atomic_save_npy,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    replace_dir,
)


def test_writes_replace_the_whole_file(tmp_path):
    path = tmp_path / "out.json"
    atomic_write_json(path, {"a": [1, 2]}, indent=1)
    assert json.loads(path.read_text()) == {"a": [1, 2]}
    atomic_write_text(path, "é\n")
    assert path.read_bytes() == "é\n".encode()
    atomic_write_bytes(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    atomic_save_npy(tmp_path / "a.npy", np.arange(5))
    assert np.load(tmp_path / "a.npy").tolist() == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "out.json"]


@pytest.mark.parametrize("how", ["open", "path", "json"])
def test_an_error_mid_write_keeps_the_old_file_and_no_temporary(tmp_path, how):
    path = tmp_path / "data.txt"
    path.write_text("old")
    with pytest.raises((RuntimeError, TypeError)):
        if how == "open":
            with atomic_open(path, "w") as f:
                f.write("new, half")
                raise RuntimeError("writer failed")
        elif how == "path":
            with atomic_path(path) as tmp:
                tmp.write_text("new, half")
                raise RuntimeError("writer failed")
        else:
            atomic_write_json(path, {"not json": object()})
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["data.txt"]


def test_a_killed_writer_leaves_no_partial_target(tmp_path):
    path = tmp_path / "big.bin"
    # the child publishes a first version, then is killed while streaming the second
    child = textwrap.dedent(
        f"""
        import sys
        from agentgym.io import atomic_open, atomic_write_bytes
        atomic_write_bytes({str(path)!r}, b"old")
        with atomic_open({str(path)!r}) as f:
            f.write(b"x" * 1_000_000)
            f.flush()
            print("writing", flush=True)
            while True:
                f.write(b"x" * 1_000)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert path.read_bytes() == b"old"
    leftovers = [p for p in tmp_path.iterdir() if p != path]
    # what a kill leaves is hidden and named after the target, so it is easy to find and remove
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".big.bin.")
    assert leftovers[0].name.endswith(".tmp") and leftovers[0].stat().st_size >= 1_000_000


def test_permissions_follow_the_umask_as_a_plain_open_would(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        with atomic_path(tmp_path / "b.txt") as tmp:
            tmp.write_text("x")
    finally:
        os.umask(old)
    # tempfile.mkstemp alone would publish 0o600: unreadable to the group that shares a cache
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o644


def test_atomic_open_refuses_modes_that_would_not_write_a_new_file(tmp_path):
    with pytest.raises(ValueError, match="mode must be"):
        with atomic_open(tmp_path / "x", "a"):
            pass
    assert list(tmp_path.iterdir()) == []


def test_replace_dir_swaps_a_whole_directory_and_leaves_nothing_aside(tmp_path):
    dst = tmp_path / "index"
    for version in ("old", "new"):
        src = tmp_path / f".index.tmp-{version}"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "data").write_text(version)
        replace_dir(src, dst)
        assert (dst / "sub" / "data").read_text() == version and not src.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["index"]


def test_replace_dir_moves_the_old_copy_to_the_name_given(tmp_path):
    dst, src, aside = tmp_path / "ckpt", tmp_path / ".ckpt.partial", tmp_path / ".ckpt.old"
    dst.mkdir()
    (dst / "f").write_text("old")
    aside.mkdir()  # a stale copy from an earlier kill: dst is newer, so it is dropped
    src.mkdir()
    (src / "f").write_text("new")
    replace_dir(src, dst, aside=aside)
    assert (dst / "f").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_replace_dir_publishes_with_the_mode_a_plain_mkdir_would_give(tmp_path):
    old = os.umask(0o022)
    try:
        for dst in (tmp_path / "fresh", tmp_path / "fresh"):  # published, then replaced
            src = Path(tempfile.mkdtemp(prefix=".staging-", dir=tmp_path))  # mode 0o700
            (src / "f").write_text("x")
            replace_dir(src, dst)
            assert dst.stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(old)
    assert [p.name for p in tmp_path.iterdir()] == ["fresh"]  # no probe left behind
