"""Jobs across peers survive what real peers do: agents, closed browsers, a reloading coordinator, a liar.

Every browser is its own Chromium process (as on different machines) on the
served site with ``?room=CODE``; the agent is the real ``weei agent``
command in a subprocess; the hostile participant is an aiortc peer in this
process that speaks the protocol (``AgentTransport``) but lies in its updates
and frames. Each test names what it waits for, so a timeout says what did
not happen; every browser and process is closed at the end, pass or fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Mapping

import pytest

from aiortc_peer import ThreadedPeer
from room_helpers import capture_console, explained
from site_helpers import CHROMIUM, CHROMIUM_ARGS, DIST, ROOT, TIMEOUT_MS
from test_api import DIGITS, ready

MODULE_SHA256 = json.loads((DIST / "models" / "digits-mlp" / "manifest.json").read_text())["wasm"]["sha256"] \
    if (DIST / "models" / "digits-mlp" / "manifest.json").is_file() else \
    json.loads((ROOT / "app" / "static" / "models" / "digits-mlp" / "manifest.json").read_text())["wasm"]["sha256"]
#: 15 digits chunks of 100 examples each.
CHUNKS, EXAMPLES_PER_CHUNK = 15, 100
NO_VALIDATION = {"enabled": False, "unit": "round", "every": 1}


def signal_url(http_url: str) -> str:
    return "ws://" + http_url.split("://", 1)[1].rstrip("/") + "/signal"


class Browsers:
    """Pages, each in a Chromium process of its own (a persistent profile on request); all closed at the end."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.processes: list[Any] = []
        self.errors: dict[int, list[str]] = {}
        self._dirs: list[tempfile.TemporaryDirectory[str]] = []

    def open(self, url: str, *, persistent: bool = False) -> Any:
        if persistent:
            user_data = tempfile.TemporaryDirectory(prefix="weei-profile-")
            self._dirs.append(user_data)
            process = self.browser.browser_type.launch_persistent_context(
                user_data.name, executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pg = process.pages[0] if process.pages else process.new_page()
        else:
            process = self.browser.browser_type.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            pg = process.new_page()
        self.processes.append(process)
        pg.set_default_timeout(TIMEOUT_MS)
        errors = self.errors.setdefault(id(pg), [])
        pg.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        capture_console(pg)
        pg._weei_process = process
        ready(pg, url)
        return pg

    def kill(self, pg: Any) -> None:
        """Close the page's whole browser process, as when a person quits the browser."""
        process = pg._weei_process
        if process in self.processes:
            self.processes.remove(process)
        process.close()

    def page_errors(self) -> list[str]:
        return [e for errors in self.errors.values() for e in errors]

    def close(self) -> None:
        for process in self.processes:
            try:
                process.close()
            except Exception:  # already gone
                pass
        self.processes.clear()
        for d in self._dirs:
            d.cleanup()


@pytest.fixture
def browsers(browser: Any) -> Iterator[Browsers]:
    pages = Browsers(browser)
    yield pages
    pages.close()


class AgentProcess:
    """``weei agent`` in a subprocess: its peer ID read from its first line; SIGTERM stops it."""

    def __init__(self, server: str, room: str, data_dir: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT / "app" / "py"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "weei.cli", "agent", "--server", server, "--room", room,
             "--accept-model", MODULE_SHA256, "--trust-room", "--data-dir", str(data_dir), "--workers", "1"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.peer_id: str | None = None
        self._joined = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if self.peer_id is None and " joined room " in line and "peer " in line:
                self.peer_id = line.split("peer ", 1)[1].split()[0]
                self._joined.set()
        self._joined.set()

    def wait_joined(self, timeout: float = 30.0) -> str:
        if not self._joined.wait(timeout) or self.peer_id is None:
            raise AssertionError(f"the agent did not join its room within {timeout:.0f} s:\n{self.output()}")
        return self.peer_id

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode


# JS run on the coordinator page: create the job and invite the given peers.
CREATE_AND_INVITE = """async ([settings, ids]) => {
  const training = T.api();
  await T.waitFor('every peer connected', () => ids.every((id) => training.getState().peers.includes(id)), 60000);
  const { wasm, manifest, files, validation } = await T.pkg('digits-mlp');
  await training.createJob({ wasm, manifest, files, validation, settings });
  for (const id of ids) training.invite(id);
  return training.getState().job.id;
}"""

WAIT_LOADED = """async (ids) => T.waitFor('participants loaded the model: ' + ids.join(', '), () => {
  const p = T.api().getState().job.participants;
  return ids.every((id) => p[id] && p[id].approved && p[id].connected
                       && !['invited', 'approved', 'disconnected'].includes(p[id].state));
}, 60000)"""

WAIT_DONE = """async (timeoutMs) => {
  await T.waitFor('the job to complete', () => T.done(T.api().getState()), timeoutMs);
  const s = T.api().getState();
  return { job: s.job, error: s.error || null, diagnostics: s.diagnostics, transferErrors: s.transferErrors,
           events: T.api().getDebugLog().events };
}"""


def accept(pg: Any, job_id: str, *, wait: bool = True) -> None:
    pg.evaluate("""(jobId) => T.waitFor('the invitation to ' + jobId,
      () => T.api().getState().invitations.some(([id]) => id === jobId))""", job_id)
    if wait:
        pg.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
    else:  # the decision leaves; nothing waits for it (the browser is about to close)
        pg.evaluate("(jobId) => { T.api().decideInvitation(jobId, true); }", job_id)


def rounds_of(job: Mapping[str, Any]) -> list[int]:
    return [c["artifact"]["round"] for c in job["checkpoints"]]


def examples_of(job: Mapping[str, Any]) -> list[int]:
    return [c["metrics"]["examplesProcessed"] for c in job["checkpoints"][1:]]


def assert_every_round_once(job: Mapping[str, Any], epochs: int) -> None:
    rounds = rounds_of(job)
    assert rounds == list(range(len(rounds))), f"rounds lost or repeated: {rounds}"
    # Every chunk trained exactly once per pass: no work lost, none counted twice.
    assert sum(examples_of(job)) == CHUNKS * EXAMPLES_PER_CHUNK * epochs, examples_of(job)
    assert job["progress"]["datasetEpoch"] == epochs and not job["incomplete"], job["progress"]


def accepted_by(events: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        if e["event"] == "update.accepted":
            peer = e["details"]["peer"]
            out[peer] = out.get(peer, 0) + 1
    return out


# ------------------------------------------------------------------ 1. three browsers and an agent


def test_three_browsers_and_an_agent_train_digits_together(weei_server: Any, browsers: Browsers,
                                                           tmp_path: Path) -> None:
    room = "res-" + uuid.uuid4().hex[:8]
    url = f"{weei_server.url}?room={room}"
    agent = AgentProcess(signal_url(weei_server.url), room, tmp_path / "agent")
    try:
        coordinator = browsers.open(url)
        participants = [browsers.open(url), browsers.open(url)]
        agent_id = agent.wait_joined()
        ids = [pg.evaluate("T.api().getState().myPeerId") for pg in participants]
        job_id = coordinator.evaluate(CREATE_AND_INVITE, [{**DIGITS, "validationSchedule": NO_VALIDATION},
                                                          [*ids, agent_id]])
        for pg in participants:
            accept(pg, job_id)
        coordinator.evaluate(WAIT_LOADED, [*ids, agent_id])  # the agent's policy accepts by module SHA-256
        coordinator.evaluate("T.api().start()")
        out = coordinator.evaluate(WAIT_DONE, 120_000)
    except BaseException as exc:
        raise AssertionError(f"{exc}\n--- agent output:\n{agent.output()}") from exc
    finally:
        code = agent.stop()
    job, me = out["job"], coordinator.evaluate("T.api().getState().myPeerId")
    assert out["error"] is None, out["error"]
    assert job["status"] == "completed"
    assert_every_round_once(job, 1)
    # Four peers train: 15 chunks are rounds of 4, 4, 4 and 3 chunks.
    assert examples_of(job) == [400, 400, 400, 300], examples_of(job)
    contributors = accepted_by(out["events"])
    assert set(contributors) == {me, *ids, agent_id}, contributors
    assert sum(contributors.values()) == CHUNKS
    assert set(out["diagnostics"]) == {me, *ids, agent_id}, list(out["diagnostics"])
    env = out["diagnostics"][agent_id]["environment"]
    assert env["browser"] == "agent" and "weei-agent" in env["browserVersion"], env
    for peer in (me, *ids):
        assert out["diagnostics"][peer]["environment"]["browser"] == "Chrome"
    assert code == 0, f"weei agent exited {code} on SIGTERM:\n{agent.output()}"
    assert f"accepted job {job_id}" in agent.output() and "closed" in agent.output(), agent.output()
    # --trust-room: the coordinator's page proved the room key to the agent before it accepted
    assert f"coordinator {me} proved the room key" in agent.output(), agent.output()
    assert not browsers.page_errors(), browsers.page_errors()


# ---------------------------------------------------- 2. browsers closed mid-transfer and mid-training


def test_participants_closed_mid_transfer_and_mid_training_lose_no_checkpoint(weei_server: Any,
                                                                             browsers: Browsers) -> None:
    room = "res-" + uuid.uuid4().hex[:8]
    url = f"{weei_server.url}?room={room}"
    coordinator = browsers.open(url)
    early, late = browsers.open(url), browsers.open(url)
    ids = [pg.evaluate("T.api().getState().myPeerId") for pg in (early, late)]
    job_id = coordinator.evaluate(CREATE_AND_INVITE, [{**DIGITS, "epochs": 2, "validationSchedule": NO_VALIDATION},
                                                      ids])
    # The first closes right after accepting: the module is on its way (or just arrived) when it goes.
    accept(early, job_id, wait=False)
    coordinator.evaluate("""(id) => T.waitFor('the acceptance of ' + id, () => {
      const p = T.api().getState().job.participants[id];
      return p && p.approved; }, 30000)""", ids[0])
    browsers.kill(early)
    accept(late, job_id)
    coordinator.evaluate(WAIT_LOADED, [ids[1]])
    seen_early = coordinator.evaluate("""(id) => T.waitFor(id + ' to show as disconnected', () => {
      const p = T.api().getState().job.participants[id];
      return p && !p.connected && p.state === 'disconnected' && p; }, 60000)""", ids[0])
    coordinator.evaluate("T.api().start()")
    # The second closes while it trains an assignment.
    coordinator.evaluate("""(id) => T.waitFor(id + ' to train', () =>
      T.api().getState().job.slots.some((s) => s.peerId === id && s.status === 'training'), 60000)""", ids[1])
    browsers.kill(late)
    seen_late = coordinator.evaluate("""(id) => T.waitFor(id + ' to show as disconnected', () => {
      const p = T.api().getState().job.participants[id];
      return p && !p.connected && p.state === 'disconnected' && p; }, 60000)""", ids[1])
    out = coordinator.evaluate(WAIT_DONE, 120_000)
    job = out["job"]
    assert out["error"] is None, out["error"]
    assert seen_early["approved"] and seen_late["approved"], (seen_early, seen_late)
    assert job["status"] == "completed"
    assert_every_round_once(job, 2)
    keys = coordinator.evaluate("T.hooks().storageKeys('checkpoints')")
    assert keys == [f"{job_id}/{r:08d}" for r in rounds_of(job)], keys
    for peer in ids:  # the job finished without them: out of the job, and not connected
        assert job["participants"][peer]["connected"] is False, job["participants"][peer]
    stopped = [e["details"] for e in out["events"] if e["event"] == "assignment.stopped"]
    assert any(d["peer"] == ids[1] and d["error"] == "participant disconnected" for d in stopped), stopped
    disconnected = [e["details"]["peer"] for e in out["events"] if e["event"] == "peer.disconnected"]
    assert set(ids) <= set(disconnected), disconnected
    assert not browsers.page_errors(), browsers.page_errors()


# ------------------------------------------------------------------- 3. the coordinator reloads


def test_coordinator_reload_mid_round_resumes_and_its_participants_come_back(weei_server: Any,
                                                                            browsers: Browsers) -> None:
    room = "res-" + uuid.uuid4().hex[:8]
    url = f"{weei_server.url}?room={room}"
    coordinator = browsers.open(url, persistent=True)
    participants = [browsers.open(url), browsers.open(url)]
    ids = [pg.evaluate("T.api().getState().myPeerId") for pg in participants]
    job_id = coordinator.evaluate(CREATE_AND_INVITE, [{**DIGITS, "epochs": 2, "validationSchedule": NO_VALIDATION},
                                                      ids])
    tabs = {"coordinator": coordinator, "participant 0": participants[0], "participant 1": participants[1]}
    with explained(tabs):
        for pg in participants:
            accept(pg, job_id)
        coordinator.evaluate(WAIT_LOADED, ids)
    before = coordinator.evaluate("""async () => {
      const training = T.api();
      await training.start();
      // Mid-round: three checkpoints saved and a round's assignments out.
      await T.waitFor('3 checkpoints and a round in progress', () => {
        const s = training.getState();
        return s.job.checkpoints.length >= 3 && s.job.slots.some((x) => x.status === 'training');
      }, 60000);
      const s = training.getState();
      return { myPeerId: s.myPeerId, rounds: T.rounds(s) };
    }""")
    coordinator.reload()
    ready(coordinator)
    reopened = coordinator.evaluate("""() => {
      const s = T.api().getState();
      return { myPeerId: s.myPeerId, id: s.job && s.job.id, status: s.job && s.job.status, rounds: T.rounds(s),
               participants: s.job.participants };
    }""")
    assert reopened["id"] == job_id and reopened["myPeerId"] == before["myPeerId"], reopened
    assert reopened["status"] == "running"
    assert reopened["rounds"][: len(before["rounds"])] == before["rounds"], (before, reopened)
    # The saved job keeps who takes part: both come back without a new invitation.
    assert set(ids) <= set(reopened["participants"]), reopened["participants"]
    with explained(tabs):
        coordinator.evaluate(WAIT_LOADED, ids)
    out = coordinator.evaluate(WAIT_DONE, 120_000)
    job = out["job"]
    assert out["error"] is None, out["error"]
    assert job["status"] == "completed"
    assert_every_round_once(job, 2)
    after_reload = [e for e in out["events"] if e["event"] == "update.accepted"
                    and e["details"]["attempt"].startswith("r")
                    and int(e["details"]["attempt"][1:].split("-")[0]) > len(before["rounds"])]
    assert set(ids) <= {e["details"]["peer"] for e in after_reload}, "the participants trained after the reload"
    assert "job.reopened" in [e["event"] for e in out["events"]]
    for pg in participants:
        assert pg.evaluate("T.api().getState().job.status") == "completed"
    assert not browsers.page_errors(), browsers.page_errors()


# ------------------------------------------------------------------ 4. a hostile participant


class HostilePeer(ThreadedPeer):
    """A participant that speaks the protocol over aiortc but lies: each assignment gets the next trick.

    It runs its own asyncio loop in a thread. ``tricks`` are played in order,
    one per assignment; a chunk it already spoiled twice gets an honest
    no-op update instead (three failures would drop the chunk from the job).
    """

    TRICKS = ["hash-mismatch+undeclared+non-finite", "late+wrong-size", "stale-round", "inflated-count",
              "missing-weights", "oversized-frame"]

    def __init__(self, server: str, room: str) -> None:
        self.tricks = list(self.TRICKS)
        self.played: list[str] = []
        self.noops = 0
        self.receipts: list[tuple[str, bool, str | None]] = []
        self.spoiled: dict[str, int] = {}
        self.attempts: list[tuple[int, str, str]] = []  # (round, assignment, attempt) answered
        self.blobs: dict[str, bytes] = {}
        self.done = threading.Event()
        super().__init__(server, room)

    def has(self, sha256: str) -> bool:
        return sha256 in self.blobs

    def failed(self, exc: BaseException) -> None:
        self.done.set()

    # The Receiver of AgentTransport.
    async def peer_connected(self, peer: str) -> None:
        pass

    async def on_peer_message(self, peer: str, message: Any, blobs: Mapping[str, bytes]) -> None:
        try:
            await self._receive(peer, message, blobs)
        except BaseException as exc:
            self.error = exc
            self.done.set()
            raise

    async def _receive(self, peer: str, message: Any, blobs: Mapping[str, bytes]) -> None:
        from weei.core.wire.commands import Send
        from weei.core.wire.messages import Assign, Deliver, Invitation, InvitationDecision, ModuleStatus, UpdateReceipt

        self.blobs.update(blobs)
        if isinstance(message, Invitation):
            self.transport.send(Send(peer, InvitationDecision(message.job_id, True)), {})
        elif isinstance(message, Deliver):
            self.transport.send(Send(peer, ModuleStatus(message.job_id, True, None, ())), {})
        elif isinstance(message, UpdateReceipt):
            self.receipts.append((message.attempt_id, message.accepted, message.reason))
        elif isinstance(message, Assign) and not self.done.is_set():
            await self._answer(peer, message)

    def _update(self, assign: Any, weights: bytes, *, round_: int | None = None, attempt: tuple[str, str] | None = None,
                count: int | None = None, declared: int | None = None, sha: str | None = None) -> tuple[Any, Any]:
        from weei.core.wire.messages import ArtifactRef, Update

        ref = ArtifactRef("update", sha or hashlib.sha256(weights).hexdigest(),
                          len(weights) if declared is None else declared)
        assignment_id, attempt_id = attempt or (assign.assignment_id, assign.attempt_id)
        update = Update(assign.job_id, assign.round if round_ is None else round_, assignment_id, attempt_id,
                        assign.checkpoint.sha256, ref, {"loss": 1.0},
                        assign.chunk.example_count if count is None else count)
        return update, ref

    def _send_update(self, peer: str, update: Any, ref: Any, data: bytes | None) -> None:
        from weei.core.wire.commands import Send

        if data is None:
            self.transport.send(Send(peer, update), {})
        else:
            self.transport.send(Send(peer, update, (ref,)), {ref.sha256: data})

    def _raw(self, peer: str, frames: list[bytes]) -> None:
        """Frames straight onto the channel, under the writer's own transfer ids."""
        self.transport.send_raw(peer, frames)

    async def _answer(self, peer: str, assign: Any) -> None:
        from weei.core.wire import framing
        from weei.core.wire.messages import encode_message

        checkpoint = self.blobs[assign.checkpoint.sha256]
        n = len(checkpoint)
        chunk = assign.chunk.id
        failing = self.tricks and self.tricks[0] != "oversized-frame"
        if failing and self.spoiled.get(chunk, 0) >= 2:
            # An honest no-op (the checkpoint back, unchanged in value): keeps the chunk in the job.
            noop = bytearray(checkpoint)
            update, ref = self._update(assign, bytes(noop))
            self._send_update(peer, update, ref, bytes(noop))
            self.noops += 1
            self.attempts.append((assign.round, assign.assignment_id, assign.attempt_id))
            return
        trick = self.tricks.pop(0)
        self.played.append(trick)
        finite = bytearray(checkpoint)
        finite[0:4] = struct.pack("<f", struct.unpack("<f", bytes(finite[0:4]))[0] + 0.5)
        finite = bytes(finite)
        if trick == "hash-mismatch+undeclared+non-finite":
            # 1. An artifact whose bytes are not the SHA-256 its begin frame announced.
            lie = hashlib.sha256(b"not these bytes").hexdigest()
            update, ref = self._update(assign, finite, sha=lie)
            self._send_update(peer, update, ref, finite)
            await self.transport.flush()
            # 2. An attachment the message does not name.
            writer = self.transport.links.writer(peer)
            extra = os.urandom(1000)
            update, _ = self._update(assign, checkpoint, sha=assign.checkpoint.sha256)  # names held bytes only
            text = json.dumps(encode_message(update), separators=(",", ":")).encode()
            art, msg = writer._new_id(), writer._new_id()
            extra_sha = hashlib.sha256(extra).hexdigest()
            self._raw(peer, [framing.artifact_begin_frame(art, "update", extra_sha, len(extra)),
                             framing.data_frame(art, 0, extra),
                             framing.message_begin_frame(msg, len(text), [(extra_sha, len(extra))]),
                             framing.data_frame(msg, 0, text)])
            # 3. NaN weights.
            nan = bytearray(finite)
            nan[4:8] = struct.pack("<f", float("nan"))
            update, ref = self._update(assign, bytes(nan))
            self._send_update(peer, update, ref, bytes(nan))
            self.spoiled[chunk] = self.spoiled.get(chunk, 0) + 1
        elif trick == "late+wrong-size":
            round_, assignment_id, attempt_id = self.attempts[-1]
            update, ref = self._update(assign, finite, round_=round_, attempt=(assignment_id, attempt_id))
            self._send_update(peer, update, ref, finite)  # an attempt already closed
            short = finite[:-4]
            update, ref = self._update(assign, short)
            self._send_update(peer, update, ref, short)
            self.spoiled[chunk] = self.spoiled.get(chunk, 0) + 1
        elif trick == "stale-round":
            update, ref = self._update(assign, finite, round_=max(1, assign.round - 1))
            self._send_update(peer, update, ref, finite)
            self.spoiled[chunk] = self.spoiled.get(chunk, 0) + 1
        elif trick == "inflated-count":
            update, ref = self._update(assign, finite, count=assign.chunk.example_count * 10)
            self._send_update(peer, update, ref, finite)
            self.spoiled[chunk] = self.spoiled.get(chunk, 0) + 1
        elif trick == "missing-weights":
            # Names bytes the coordinator holds (its own checkpoint) but sends none with the update.
            update, ref = self._update(assign, checkpoint, sha=assign.checkpoint.sha256)
            self._send_update(peer, update, ref, None)
            self.spoiled[chunk] = self.spoiled.get(chunk, 0) + 1
        elif trick == "oversized-frame":
            await self.transport.flush()
            self._raw(peer, [framing.data_frame(1 << 20, 0, os.urandom(framing.HARD_MAX_FRAME_BYTES))])
            await self.transport.flush()
            await asyncio.sleep(0.3)
            await self.transport.close()  # gone from the room: nobody re-offers
            self.done.set()
        self.attempts.append((assign.round, assign.assignment_id, assign.attempt_id))
        assert n == assign.checkpoint.bytes


def test_hostile_participant_is_refused_by_name_and_the_job_completes(weei_server: Any, browsers: Browsers) -> None:
    pytest.importorskip("aiortc")
    room = "res-" + uuid.uuid4().hex[:8]
    url = f"{weei_server.url}?room={room}"
    hostile = HostilePeer(signal_url(weei_server.url), room)
    try:
        coordinator = browsers.open(url)
        honest = browsers.open(url)
        assert hostile.joined.wait(30) and hostile.peer_id, f"the hostile peer did not join: {hostile.error!r}"
        bad = hostile.peer_id
        good = honest.evaluate("T.api().getState().myPeerId")
        job_id = coordinator.evaluate(CREATE_AND_INVITE, [{**DIGITS, "epochs": 2, "validationSchedule": NO_VALIDATION},
                                                          [good, bad]])
        accept(honest, job_id)
        coordinator.evaluate(WAIT_LOADED, [good, bad])
        coordinator.evaluate("T.api().start()")
        deadline = time.monotonic() + 90
        while not hostile.done.wait(0.5):
            if time.monotonic() > deadline:
                raise AssertionError(f"the hostile peer played only {hostile.played} in 90 s")
        assert hostile.error is None, repr(hostile.error)
        # The broken channel is named at once (a reconnection would clear it).
        channel = coordinator.evaluate("""(id) => T.waitFor('the oversized frame to break the channel', () =>
          T.api().getState().transferErrors['channel:' + id], 30000)""", bad)
        out = coordinator.evaluate(WAIT_DONE, 120_000)
    finally:
        hostile.close()
    job = out["job"]
    assert out["error"] is None, out["error"]
    assert job["status"] == "completed"
    assert_every_round_once(job, 2)
    assert hostile.played == HostilePeer.TRICKS
    rejected = [e["details"] for e in out["events"] if e["event"] == "update.rejected"]
    assert {d["peer"] for d in rejected} == {bad}, rejected
    reasons = [d["reason"] for d in rejected]
    for reason in ("non-finite-weights", "late-update", "wrong-size", "stale-round", "inflated-count",
                   "missing-weights"):
        assert reason in reasons, (reason, reasons)
    # The hostile peer was told each reason too.
    told = {r.split(":")[0] for _, ok, r in hostile.receipts if not ok and r}
    assert {"non-finite-weights", "wrong-size", "stale-round", "inflated-count", "missing-weights"} <= told, told
    # What never reached the coordinator's state machine is refused by the framing, by name.
    errors = out["transferErrors"]
    lie = hashlib.sha256(b"not these bytes").hexdigest()
    # The bytes behind the announced SHA-256 (the message naming them then misses them: the cause stays shown).
    assert errors.get(lie, "").startswith("hash-mismatch"), errors
    assert errors.get(f"message:{bad}", "").startswith("bad-message"), errors  # the attachment nobody named
    assert channel.startswith("oversized-frame"), channel
    # Only the no-ops it sent to keep a twice-spoiled chunk alive counted; everything else came from honest peers.
    assert accepted_by(out["events"]).get(bad, 0) == hostile.noops
    assert job["participants"][bad]["connected"] is False
    assert job["participants"][good]["state"] == "stopped"
    assert not browsers.page_errors(), browsers.page_errors()
