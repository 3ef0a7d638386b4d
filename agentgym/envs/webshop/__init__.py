"""WebShop: the text shopping benchmark (princeton-nlp/WebShop), on Python 3.11.

:class:`WebShopEnv` plays WebShop's text mode with WebShop's page text, actions and reward
(``AgentGym/WebShop-v0`` on WebShop's own data files, ``AgentGym/WebShop-Synthetic-v0`` on a
generated shop). :func:`load_catalogue` loads WebShop's product and instruction files (or the
project's generated shop, :mod:`.synthetic`) as WebShop's own loader does, with prices drawn from
a fixed seed and fixed train/valid/test goal splits; :func:`product_search` is the shared BM25
product index; :func:`data_status` says which files were found.
"""

from agentgym.envs.webshop.data import (
    SPLITS,
    Catalogue,
    DataNotFoundError,
    data_status,
    load_catalogue,
)
from agentgym.envs.webshop.env import SEARCH_ACTION, WebShopEnv, parse_action
from agentgym.envs.webshop.search import SEARCH_RETURN_N, ProductSearch, product_search

__all__ = [
    "SEARCH_ACTION",
    "SEARCH_RETURN_N",
    "SPLITS",
    "Catalogue",
    "DataNotFoundError",
    "ProductSearch",
    "WebShopEnv",
    "data_status",
    "load_catalogue",
    "parse_action",
    "product_search",
]
