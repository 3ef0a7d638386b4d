"""WebShop: the text shopping benchmark (princeton-nlp/WebShop), on Python 3.11.

:func:`load_catalogue` loads WebShop's product and instruction files (or the project's generated
shop, :mod:`.synthetic`) as WebShop's own loader does, with prices drawn from a fixed seed and
fixed train/valid/test goal splits; :func:`data_status` says which files were found.
"""

from agentgym.envs.webshop.data import (
    SPLITS,
    Catalogue,
    DataNotFoundError,
    data_status,
    load_catalogue,
)

__all__ = ["SPLITS", "Catalogue", "DataNotFoundError", "data_status", "load_catalogue"]
