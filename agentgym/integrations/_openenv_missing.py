"""The import error of the OpenEnv adapters, kept apart so that both can raise it without
importing each other (or the command line)."""

from __future__ import annotations


def missing_openenv(what: str, cause: ImportError | None = None) -> ImportError:
    """The error for ``what`` when OpenEnv's modules cannot be imported: the extra to install,
    or, where ``openenv-core`` (an older OpenEnv that installs the same ``openenv`` module) is
    what is installed, that package named with the commands that replace it. ``cause``: the
    import's error; a package the extra installs other than openenv itself (fastapi,
    websockets...) is named as the missing one."""
    import importlib.metadata

    from agentgym.extras import MissingExtra, missing_extra

    module = (getattr(cause, "name", None) or "").split(".")[0]
    if isinstance(cause, ModuleNotFoundError) and module and module != "openenv":
        return missing_extra(what, module, "openenv")
    try:
        core = importlib.metadata.version("openenv-core")
    except importlib.metadata.PackageNotFoundError:
        return missing_extra(what, "openenv", "openenv")
    return MissingExtra(
        f"{what} needs openenv >= 0.10, but the installed openenv module is openenv-core "
        f"{core}'s (an older OpenEnv under the same name): pip uninstall -y openenv-core && "
        'pip install "agentgym-envs[openenv]" (in a clone: pip install -e ".[openenv]")'
    )
