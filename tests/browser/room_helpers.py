"""A coordinator and its participants in one signaling room: pages of the served site, each in a Chromium
process of its own (conftest's ``browsers``), that see each other and take the coordinator's job.

Used by the tests that train across pages (test_peers.py, test_secagg_pages.py, test_relay_pages.py); what
each asserts stays in the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: JS run on the coordinator page: create a job from one of the site's model packages (with its validation
#: file or not) and invite every peer in the room.
CREATE_AND_INVITE = """async ([modelId, settings, withValidation]) => {
  const training = T.api();
  const { wasm, manifest, files, validation } = await T.pkg(modelId);
  const job = { wasm, manifest, files, settings };
  if (withValidation) job.validation = validation;
  await training.createJob(job);
  for (const peerId of training.getState().peers) training.invite(peerId);
  return training.getState().job.id;
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


@dataclass(frozen=True)
class Room:
    coordinator: Any
    participants: list[Any]
    #: The participants' peer IDs, in the order of ``participants``.
    ids: list[str]
    coordinator_id: str

    def create_job(self, model_id: str, settings: dict[str, Any], *, validation: bool = True) -> str:
        """Create the job on the coordinator page and invite every peer; returns the job's id."""
        job_id: str = self.coordinator.evaluate(CREATE_AND_INVITE, [model_id, settings, validation])
        return job_id

    def accept(self, job_id: str, check: Callable[[Any, dict[str, Any]], None] | None = None, *,
               loaded_ms: int = 60_000) -> None:
        """Each participant in turn waits for the invitation, hands its page and the entry to ``check`` (before it
        decides) and accepts; returns once the coordinator sees every participant's model loaded."""
        for pg in self.participants:
            entry = pg.evaluate(WAIT_INVITATION, job_id)
            if check is not None:
                check(pg, entry)
            pg.evaluate("(jobId) => T.api().decideInvitation(jobId, true)", job_id)
        self.coordinator.evaluate(WAIT_LOADED, [self.ids, loaded_ms])


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
