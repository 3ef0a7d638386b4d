"""Search-QA answer scoring: Search-R1's normalisation, exact match and token F1.

The implementation is :mod:`agentgym.answers`, shared with the judges (which may not import the
envs); this module keeps the family's own import path.
"""

from agentgym.answers import as_answer_list, exact_match, f1, normalize_answer

__all__ = ["normalize_answer", "as_answer_list", "exact_match", "f1"]
