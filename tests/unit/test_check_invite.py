"""TrainingController.check_invite: the refusal invite() would give, without its effects.

The page answers invite() on its main thread from these refusals, which the host worker publishes
(weei.browser.page_api.PageApi._invite_refusals): each must be exactly the error invite() raises, in the
same order of checks, and an allowed check must change nothing.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from test_controller import DIGITS_SETTINGS, networked, package

from weei.api import TrainingController
from weei.core.errors import UsageError
from weei.demo.network import MemoryNetwork
from weei.host.memory_storage import MemoryKeyValue, MemoryStorage
from weei.host.worker_pool import ThreadWorkerPool
from weei.kernel.native import NativeKernel
from weei.runtime.wasmtime_engine import WasmtimeEngine


def _refusal(call: object) -> tuple[str, str] | None:
    try:
        call()  # type: ignore[operator]
    except UsageError as exc:
        return exc.reason, exc.message
    return None


def test_check_invite_refuses_as_invite_does_and_changes_nothing() -> None:
    async def main() -> None:
        network, engine = MemoryNetwork(), WasmtimeEngine()

        def make(peer: str) -> TrainingController:
            return networked(network, engine, peer, environment={"browser": "agent", "os": "Linux"})

        coordinator, helper = make("coord"), make("helper")
        for c in (coordinator, helper):
            await c.init()
        refusal = _refusal(lambda: coordinator.check_invite("helper"))
        assert refusal is not None and refusal[0] == "no-job"
        assert _refusal(lambda: coordinator.invite("helper")) == refusal
        job_id = await coordinator.create_job(**package("digits-mlp"), settings={**DIGITS_SETTINGS, "epochs": 1})
        cases = [(coordinator, "nobody", "peer-not-connected"), (coordinator, "coord", "peer-not-connected"),
                 (coordinator, "helper", None)]
        for c, peer, reason in cases:
            refusal = _refusal(lambda: c.check_invite(peer))
            assert (refusal and refusal[0]) == reason, (peer, refusal)
            if refusal is not None:
                assert _refusal(lambda: c.invite(peer)) == refusal, "the same error, word for word"
        # Allowed: nothing happened until invite() itself.
        assert "helper" not in coordinator.get_state()["job"]["participants"]
        assert not helper.get_state()["invitations"]
        coordinator.invite("helper")
        await network.settle()
        await helper.decide_invitation(job_id, True)
        await network.settle()
        assert coordinator.get_state()["job"]["participants"]["helper"]["approved"] is True
        refusal = _refusal(lambda: coordinator.check_invite("helper"))
        assert refusal is not None and refusal[0] == "already-participating"
        assert _refusal(lambda: coordinator.invite("helper")) == refusal
        # A participant is told who may invite.
        refusal = _refusal(lambda: helper.check_invite("coord"))
        assert refusal is not None and refusal[0] == "not-coordinator"
        assert _refusal(lambda: helper.invite("coord")) == refusal
        await coordinator.stop()
        refusal = _refusal(lambda: coordinator.check_invite("helper"))
        assert refusal is not None and refusal[0] == "job-completed"
        assert _refusal(lambda: coordinator.invite("helper")) == refusal

    asyncio.run(main())


def test_check_invite_without_a_transport_refuses_every_peer() -> None:
    async def main() -> None:
        engine = WasmtimeEngine()
        c = TrainingController(my_peer_id="me", storage=MemoryStorage(), kv=MemoryKeyValue(),
                               pool=ThreadWorkerPool(engine, 1), kernel=NativeKernel(), engine=engine,
                               clock=lambda: time.time() * 1000, monotonic=lambda: time.monotonic() * 1000,
                               random_bytes=os.urandom)
        await c.init()
        await c.create_job(**package("digits-mlp"), settings=DIGITS_SETTINGS)
        with pytest.raises(UsageError) as err:
            c.check_invite("someone")
        assert err.value.reason == "peer-not-connected" and err.value.message == "peer someone is not connected to you"

    asyncio.run(main())
