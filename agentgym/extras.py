"""Optional packages: how agentgym says one is missing.

Every place that needs an optional package (an env's simulator, an integration's library, the
Ray backend) raises :class:`MissingExtra` with a one-line message built by :func:`missing_extra`,
naming the extra that installs it. This module imports nothing of agentgym, so any part of the
package can use it without creating an import cycle.
"""

from __future__ import annotations

import importlib

__all__ = ["DISTRIBUTION", "MissingExtra", "install_hint", "missing_extra", "require"]

#: The name agentgym is published under on the package index (``agentgym`` there is an
#: unrelated project); install hints name it.
DISTRIBUTION = "agentgym-envs"


def install_hint(extra: str) -> str:
    """The command that installs an optional extra: what works today first (an editable
    install in a clone; the distribution is not on the package index yet), then the index's."""
    return (
        f'pip install -e ".[{extra}]" in a clone of agentgym '
        f'(once published: pip install "{DISTRIBUTION}[{extra}]")'
    )


class MissingExtra(ImportError):
    """Optional packages are not installed; the message names the extra that installs them.

    A subclass of ``ImportError``, so callers that catch ``ImportError`` still do.
    """


def missing_extra(
    what: str, package: str, extra: str, alternative: str | None = None
) -> MissingExtra:
    """The error to raise when ``what`` (e.g. ``'backend="ray"'``) needs ``package``, which is
    not installed: ``raise missing_extra(...) from exc``. ``alternative`` names another way
    that needs no install (e.g. ``"use backend='hf'"``)."""
    message = f"{what} needs {package}, not installed: {install_hint(extra)}"
    return MissingExtra(f"{message}; or {alternative}" if alternative else message)


def require(what: str, extra: str, *modules: str) -> None:
    """Import ``modules``, the packages ``what`` needs; the first that is not installed raises
    :class:`MissingExtra` naming ``extra``, the extra of pyproject.toml that installs it.

    A module that is installed but fails to import for another reason (a missing dependency
    of its own, a broken install) raises its own error unchanged.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != module.split(".")[0]:
                raise
            raise missing_extra(what, module, extra) from exc
