"""Unit-test settings shared by every module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _webrtc_on_loopback_only() -> Iterator[None]:
    """aiortc peers in these tests gather host candidates on 127.0.0.1 only, so no test
    traffic ever goes to another address of this machine."""
    try:
        import aioice.ice
    except ImportError:  # aiortc is not installed: nothing to restrict
        yield
        return
    original = aioice.ice.get_host_addresses

    def loopback_only(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return ["127.0.0.1"] if use_ipv4 else []

    aioice.ice.get_host_addresses = loopback_only
    yield
    aioice.ice.get_host_addresses = original
