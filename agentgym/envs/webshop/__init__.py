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
from agentgym.family import HISTORY_INTRO, FamilySpec, PromptTemplate

__all__ = [
    "FAMILY",
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

#: What shared code asks of WebShop: verl-agent's WebShop prompt; no rule judge (the score exists
#: only at the purchase, so nothing scores a round before it: use an LLM judge); WebShop's
#: train/test goal splits.
FAMILY = FamilySpec(
    prompt=PromptTemplate(
        first=(
            "You are an expert autonomous agent operating in the WebShop e-commerce "
            "environment.\n{task_line}Your current observation is: {observation}\n"
            "{admissible_line}\n{instruction}\n"
        ),
        later=(
            "You are an expert autonomous agent operating in the WebShop e-commerce "
            "environment.\n{task_line}" + HISTORY_INTRO + "{admissible_line}\n{instruction}\n"
        ),
        task_prefix="Your task is to: ",
        admissible_line="Your admissible actions of the current situation are: [\n{actions}\n].\n",
        admissible_style="quoted_commas",
        task_key=("goal.instruction_text",),  # the goal also holds the target product
    ),
    trainer_defaults={"train_split": "train", "eval_split": "test"},
    data_env_var="WEBSHOP_DATA",
)
