"""The ``>>>`` examples of the public docstrings run, so they stay true.

Each module's examples run with its own globals, as ``python -m doctest`` would, but on the
imported package (registered ids, families). Keep examples fast: the whole file runs in seconds.
"""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest

MODULES = [
    "agentgym",
    "agentgym.core",
    "agentgym.family",
    "agentgym.envs",
    "agentgym.io",
    "agentgym.net",
    "agentgym.testing",
    "agentgym.vector.vector_env",
    "agentgym.vector.records",
    "agentgym.algorithms.advantage",
    "agentgym.algorithms.judges",
]

#: examples the public surface must keep (a module losing all of them fails here)
AT_LEAST = {
    "agentgym.core": 3,
    "agentgym.family": 3,
    "agentgym.envs": 2,
    "agentgym.io": 3,
    "agentgym.vector.vector_env": 1,
    "agentgym.vector.records": 2,
    "agentgym.algorithms.advantage": 1,
}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    with np.printoptions(legacy=False):
        result = doctest.testmod(
            module,
            optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
            raise_on_error=False,
            report=True,
        )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
    tested = sum(
        1
        for test in doctest.DocTestFinder().find(module)
        if test.examples and test.name.startswith(name)
    )
    assert tested >= AT_LEAST.get(name, 0), f"{name} has {tested} documented examples"
