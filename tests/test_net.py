"""agentgym.net: the one loopback test both unauthenticated servers bind by."""

from __future__ import annotations

import pytest

from agentgym.net import is_loopback


def test_loopback_hosts_and_others():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.1.2.3", "example.org", "", "[::1]"]))


def test_both_servers_use_the_one_helper():
    pytest.importorskip("fastapi")
    from agentgym.retrieval import server as retrieval_server

    assert retrieval_server._is_loopback is is_loopback
    pytest.importorskip("openenv")
    from agentgym.integrations import openenv_server

    assert openenv_server.is_loopback is is_loopback
