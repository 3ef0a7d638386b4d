"""Network helpers shared by agentgym's servers (``agentgym serve``, the retrieval server).

Both servers have no authentication, so both bind loopback by default and warn when told to
bind anything else; :func:`is_loopback` is the one test of "anything else".
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server reachable from this machine only.

    True for ``localhost`` and every loopback address (``127.0.0.0/8``, ``::1``); False for
    every other address and for any other host name, which may resolve to anything.

    >>> is_loopback("127.0.0.2"), is_loopback("::1"), is_loopback("localhost")
    (True, True, True)
    >>> is_loopback("0.0.0.0"), is_loopback("::"), is_loopback("example.org"), is_loopback("")
    (False, False, False, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False
