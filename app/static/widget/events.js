// Events a person should hear about (issue 24, item 12): a peer that leaves the room or the job, pauses,
// declines, fails to load the model, is excluded or disconnects. Found by comparing each state with the
// one before (pure: `eventsBetween`); the window keeps the last ones in its Events section and says each
// in its live region.

import { h } from './dom.js';
import { peerLabel } from './names.js';

export const MAX_EVENTS = 50;

const PEER_STATE_WORDS = {
  declined: 'declined the invitation',
  modelLoadFailed: 'could not load the model',
  disconnected: 'disconnected from the job',
  stopped: 'left the job',
};

/** What changed between `before` and `after` (two getState() snapshots) that a person should hear. */
export function eventsBetween(before, after) {
  if (!before || !after) return [];
  const out = [];
  const name = (peer) => peerLabel(after, peer) || peerLabel(before, peer);
  const was = new Set(before.peers || []);
  const now = new Set(after.peers || []);
  for (const peer of was) if (!now.has(peer)) out.push({ peer, kind: 'left-room', text: `${peerLabel(before, peer)} left the room` });
  for (const peer of now) if (!was.has(peer)) out.push({ peer, kind: 'joined-room', text: `${name(peer)} joined the room` });
  const jobBefore = before.job || null;
  const jobAfter = after.job || null;
  if (jobBefore && jobAfter && jobBefore.id === jobAfter.id && jobAfter.status !== 'completed') {
    const pb = jobBefore.participants || {};
    const pa = jobAfter.participants || {};
    for (const [peer, p] of Object.entries(pa)) {
      const q = pb[peer];
      if (!q) continue;
      if (p.state !== q.state && PEER_STATE_WORDS[p.state]) {
        // A decline says why when the peer said (an agent names the rule of its policy that refused).
        const why = p.state === 'declined' && typeof p.declined === 'string' && p.declined !== 'declined' ? `: ${p.declined}` : '';
        out.push({ peer, kind: p.state, text: `${name(peer)} ${PEER_STATE_WORDS[p.state]}${why}` });
      }
      if (p.paused && !q.paused) out.push({ peer, kind: 'paused', text: `${name(peer)} paused its contribution` });
      if (!p.paused && q.paused) out.push({ peer, kind: 'resumed', text: `${name(peer)} resumed its contribution` });
      if (p.excluded && !q.excluded) out.push({ peer, kind: 'excluded', text: `${name(peer)} was excluded (an outlier round after round)` });
    }
  }
  return out;
}

export class Events {
  buildEvents() {
    this.events = [];
    this.eventsBefore = null;
    this.eventsList = h('ol', { class: 'events', 'aria-label': 'Events, newest first' });
    this.sections.events.content.append(this.eventsList);
  }

  renderEvents(state) {
    const fresh = eventsBetween(this.eventsBefore, state);
    this.eventsBefore = state;
    if (!fresh.length && this.eventsList.childElementCount) return;
    const at = new Date().toLocaleTimeString();
    for (const e of fresh) this.events.unshift({ ...e, at });
    this.events.length = Math.min(this.events.length, MAX_EVENTS);
    if (fresh.length) this.live.textContent = fresh.map((e) => e.text).join('. ');
    this.sections.events.note.textContent = this.events.length ? String(this.events.length) : '';
    this.eventsList.replaceChildren(...(this.events.length ? this.events.map((e) => h('li', { 'data-kind': e.kind, 'data-peer': e.peer },
      h('span', { class: 'muted small', text: `${e.at} ` }), h('span', { text: e.text })))
      : [h('li', { class: 'muted small', text: 'Nothing yet: peers leaving, pausing, declining or failing show here.' })]));
  }
}

export const EVENTS_CSS = `
ol.events { list-style: none; margin: 4px 0; padding: 0; max-height: 12em; overflow: auto; }
ol.events li { padding: 2px 0; border-bottom: 1px solid var(--line); overflow-wrap: anywhere; }
ol.events li[data-kind=declined], ol.events li[data-kind=modelLoadFailed], ol.events li[data-kind=excluded] { color: var(--danger); }
`;
