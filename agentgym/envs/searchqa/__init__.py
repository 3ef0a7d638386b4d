"""Search-augmented QA: Search-R1's setting (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue,
Bamboogle) as a text env.

:class:`SearchQAEnv` plays real Search-R1-style question files over any retriever of
:mod:`agentgym.retrieval` (``AgentGym/SearchQA-v0``) and the project's generated knowledge base
over in-process BM25 (``AgentGym/SearchQA-Synthetic-v0``, :mod:`.synthetic`). Scoring
(:func:`exact_match`, :func:`f1`, :func:`normalize_answer`) is Search-R1's; :func:`data_status`
says what data was found; :class:`ScriptedSearchPolicy` solves the synthetic questions by
searching and reading; :func:`write_search_r1_files` writes the synthetic benchmark as Search-R1's
corpus and parquet files.
"""

from agentgym.envs.searchqa.data import DATA_ENV, RETRIEVER_ENV, data_status, load_questions
from agentgym.envs.searchqa.env import (
    SearchQAEnv,
    parse_qa_action,
    passages_to_string,
    shared_retriever,
)
from agentgym.envs.searchqa.qa import exact_match, f1, normalize_answer
from agentgym.envs.searchqa.scripted import ScriptedSearchPolicy, parse_question
from agentgym.envs.searchqa.synthetic import (
    build_knowledge_base,
    knowledge_base,
    write_search_r1_files,
)
from agentgym.family import FamilySpec, JudgeSpec, PromptTemplate

__all__ = [
    "FAMILY",
    "DATA_ENV",
    "RETRIEVER_ENV",
    "SearchQAEnv",
    "ScriptedSearchPolicy",
    "build_knowledge_base",
    "data_status",
    "exact_match",
    "f1",
    "knowledge_base",
    "load_questions",
    "normalize_answer",
    "parse_qa_action",
    "parse_question",
    "passages_to_string",
    "shared_retriever",
    "write_search_r1_files",
]

#: What shared code asks of search-QA: Search-R1's prompt (the question, then each query with
#: what it returned), in the ``<search>`` / ``<answer>`` format; a rule judge that reads
#: ``info["retrieved_answer"]`` (a search round that brought a passage holding a golden answer)
#: and the answer round's F1; Search-R1's response length (500 tokens) and train/test splits.
FAMILY = FamilySpec(
    prompt=PromptTemplate(
        first=(
            "You are an expert agent tasked with answering the given question step-by-step.\n"
            "{task_line}\n{instruction}\n"
        ),
        later=(
            "You are an expert agent tasked with answering the given question step-by-step.\n"
            "{task_line}\nPrior to this step, you have already taken {step_count} step(s). "
            "Below is the interaction history where <search> </search> wrapped your past search "
            "queries and <information> </information> wrapped the corresponding search results "
            "returned by the external search engine. History:\n{history}\n\n{instruction}\n"
        ),
        task_prefix="Your question: ",
        history_style="search",
        default_fmt="search_answer",
        task_from_observation=True,
    ),
    rule_judge=JudgeSpec("searchqa"),
    trainer_defaults={"max_new_tokens": 500, "train_split": "train", "eval_split": "test"},
    data_env_var=DATA_ENV,
    lists_actions=False,  # queries and answers are free text
    llm_judge="search_rounds",  # judged as CW-GRPO judges search rounds
)
