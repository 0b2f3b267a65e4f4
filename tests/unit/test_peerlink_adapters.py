"""The shared link-adapter suite (tests/browser/link_cases.py) against the aiortc agent's transport.

tests/browser/test_rtc.py runs the same cases against the page's transport
in headless Chromium: both adapters must behave the same.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aiortc")

from aiohttp.test_utils import TestServer  # noqa: E402

from weei.agent.transport import AgentTransport  # noqa: E402
from weei.server.signaling import SignalingConfig, create_signaling_app  # noqa: E402
from weei.agent.signaling_client import SignalingClient  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "browser"))
from link_cases import CASES  # noqa: E402


class AgentPlatform:
    def __init__(self, url: str) -> None:
        self.url = url

    async def new(self) -> AgentTransport:
        transport = AgentTransport(SignalingClient(self.url))
        await transport.connect()
        return transport

    async def join(self, transport: Any, room: str) -> None:
        await transport.join(room)

    async def close(self, transport: Any) -> None:
        await transport.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_agent_transport(case: str) -> None:
    async def scenario() -> None:
        server = TestServer(create_signaling_app(SignalingConfig(secret=b"e" * 32)), host="127.0.0.1")
        await server.start_server()
        try:
            await asyncio.wait_for(CASES[case](AgentPlatform(str(server.make_url("/signal"))),
                                               "link-" + uuid.uuid4().hex[:8]), 60)
        finally:
            await server.close()
    asyncio.run(scenario())
