"""A coordinator and its participants in one signaling room: pages of the served site, each in a Chromium
process of its own (conftest's ``browsers``), that see each other and take the coordinator's job.

Used by the tests that train across pages (test_peers.py, test_secagg_pages.py, test_relay_pages.py); what
each asserts stays in the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: JS run on the coordinator page: create a job from one of the site's model packages (with its validation
#: file or not) and invite each of the participants, by ID, once its channel is open (a channel can be
#: reconnecting at that moment: iterating ``peers`` would skip that participant without a word).
CREATE_AND_INVITE = """async ([modelId, settings, withValidation, ids]) => {
  const training = T.api();
  const { wasm, manifest, files, validation } = await T.pkg(modelId);
  const job = { wasm, manifest, files, settings };
  if (withValidation) job.validation = validation;
  await training.createJob(job);
  await T.waitFor('every participant connected', () => ids.every((id) => training.getState().peers.includes(id)));
  for (const id of ids) training.invite(id);
  return training.getState().job.id;
}"""

#: JS run on the coordinator page: invite each of the participants, by ID, once its channel is open.
INVITE = """async (ids) => {
  await T.waitFor('every participant connected', () => ids.every((id) => T.api().getState().peers.includes(id)));
  for (const id of ids) T.api().invite(id);
}"""

#: JS run on a participant page: wait for the invitation to a job; returns its entry of state.invitations.
WAIT_INVITATION = """(jobId) => T.waitFor('the invitation', () => {
  const found = T.api().getState().invitations.find(([id]) => id === jobId);
  return found && found[1];
})"""

#: JS run on the coordinator page: wait until every participant accepted and loaded the model.
WAIT_LOADED = """([ids, timeoutMs]) => T.waitFor('participants loaded the model', () => {
  const p = T.api().getState().job.participants;
  return ids.every((id) => p[id] && p[id].approved && p[id].state !== 'approved');
}, timeoutMs)"""


#: JS run on any page: what its API says about the job, the links and the invitations, and the end of its debug
#: log, for a failure message.
DESCRIBE = """() => { const a = T.api(); const s = a.getState(); return JSON.stringify({
  me: s.myPeerId, peers: s.peers, invitations: s.invitations.map(([id]) => id),
  job: s.job && { id: s.job.id, role: s.job.role, status: s.job.status, participants: s.job.participants },
  transferErrors: s.transferErrors, events: a.getDebugLog().events.slice(-40).map((e) => [e.event, e.details]) }); }"""


def capture_console(pg: Any) -> None:
    """Keep the page's console (the link layer logs there: channels opening, closing, sends dropped)."""
    lines: list[str] = []
    pg.on("console", lambda m: lines.append(f"{m.type}: {m.text}"[:400]))
    pg._weei_console = lines


def explain(tabs: dict[str, Any]) -> str:
    """Each page's state (DESCRIBE) and the end of its console: a timeout is otherwise silent about which
    side stalled, and whether a message was never sent or never arrived."""
    out = []
    for name, pg in tabs.items():
        try:
            out.append(f"--- {name}: {pg.evaluate(DESCRIBE)}")
        except Exception as exc:  # a crashed page still lets the others speak
            out.append(f"--- {name}: unreadable ({exc})")
        out.extend(f"    {line}" for line in getattr(pg, "_weei_console", [])[-40:])
    return "\n".join(out)


@contextmanager
def explained(tabs: dict[str, Any]) -> Iterator[None]:
    """Re-raise a failure inside with every page's explanation."""
    try:
        yield
    except Exception as exc:
        raise AssertionError(f"{exc}\n{explain(tabs)}") from None


@dataclass(frozen=True)
class Room:
    coordinator: Any
    participants: list[Any]
    #: The participants' peer IDs, in the order of ``participants``.
    ids: list[str]
    coordinator_id: str

    def create_job(self, model_id: str, settings: dict[str, Any], *, validation: bool = True) -> str:
        """Create the job on the coordinator page and invite every peer; returns the job's id."""
        with explained(self.tabs()):
            job_id: str = self.coordinator.evaluate(CREATE_AND_INVITE, [model_id, settings, validation, self.ids])
        return job_id

    def accept(self, job_id: str, check: Callable[[Any, dict[str, Any]], None] | None = None, *,
               loaded_ms: int = 60_000) -> None:
        """Each participant in turn waits for the invitation, hands its page and the entry to ``check`` (before it
        decides) and accepts; returns once the coordinator sees every participant's model loaded."""
        for pg in self.participants:
            with explained(self.tabs()):
                entry = pg.evaluate(WAIT_INVITATION, job_id)
            if check is not None:
                check(pg, entry)
            pg.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
        with explained(self.tabs()):
            self.coordinator.evaluate(WAIT_LOADED, [self.ids, loaded_ms])

    def tabs(self) -> dict[str, Any]:
        """Every page by role, for ``explain``."""
        return {"coordinator": self.coordinator, **{f"participant {i}": pg for i, pg in enumerate(self.participants)}}


def join_room(server_url: str, browsers: Callable[..., Any], participants: int, *, mesh: bool = False) -> Room:
    """A coordinator page and ``participants`` pages in a fresh room. Returns once the coordinator sees every
    participant or, with ``mesh``, once every participant sees the coordinator and each other."""
    url = f"{server_url}?room=test-{uuid.uuid4().hex[:8]}"
    coordinator = browsers(url)
    pages = [browsers(url) for _ in range(participants)]
    ids = [pg.evaluate("T.api().getState().myPeerId") for pg in pages]
    me = coordinator.evaluate("T.api().getState().myPeerId")
    if mesh:
        for pg in pages:
            pg.evaluate("(ids) => T.waitFor('the mesh', () => ids.every((id) => id === T.api().getState().myPeerId"
                        " || T.api().getState().peers.includes(id)), 120000)", [me, *ids])
    else:
        coordinator.evaluate("(ids) => T.waitFor('every participant connected', "
                             "() => ids.every((id) => T.api().getState().peers.includes(id)))", ids)
    return Room(coordinator, pages, ids, me)
