// Peers' display names (state.peerNames, from each peer's own card: docs/api.md "Names"). A name is
// untrusted text from another peer: it is only ever set as textContent (h(..., {text})), never as markup.

import { h } from './dom.js';

/** What to call `peer`: "you" for this tab, its label ("Chrome on Linux #2") or a short ID until it answers. */
export function peerLabel(state, peer, { you = 'you' } = {}) {
  if (peer && state && peer === state.myPeerId) return you;
  const card = state && state.peerNames && state.peerNames[peer];
  return card && card.label ? card.label : String(peer || '').slice(0, 10);
}

/** The card of `peer`, or null when it has not said who it is (an older Weei, or a stale tab). */
export function peerCard(state, peer) {
  const card = state && state.peerNames && state.peerNames[peer];
  return card || null;
}

/** What `peer` does, in words: "idle", "in job Digits MLP", "coordinating Digits MLP"; null if unknown. */
export function activityText(card) {
  if (!card) return null;
  if (card.activity === 'coordinating') return card.job ? `coordinating ${card.job}` : 'coordinating a job';
  if (card.activity === 'training') return card.job ? `in job ${card.job}` : 'in a job';
  return 'idle';
}

/** The peer's name with its markers: an agent chip, "you", the ID in a tooltip. */
export function peerName(state, peer) {
  const card = peerCard(state, peer);
  const me = state && peer === state.myPeerId;
  return h('span', { class: 'peername', title: peer, 'data-peer-name': peer },
    h('b', { text: me ? `${card ? card.label : 'this browser'}` : peerLabel(state, peer) }),
    me ? h('span', { class: 'chip you', text: 'you' }) : null,
    card && card.agent ? h('span', { class: 'chip agent', text: 'agent', title: 'a `weei agent` process, not a browser' }) : null);
}

export const NAMES_CSS = `
.peername { display: inline-flex; align-items: baseline; gap: 4px; flex-wrap: wrap; overflow-wrap: break-word; }
table.participants td:first-child { min-width: 8em; }
.chip.you { background: #e4ecfb; color: #1d3f7a; }
.chip.agent { background: #efe4fb; color: #4d2a7a; }
.peerrow { display: flex; align-items: center; gap: 8px; flex-wrap: wrap; margin: 3px 0; }
.peerrow .what { flex: 1; min-width: 8em; }
.namefield { display: inline-flex; align-items: center; gap: 4px; }
.namefield input, .roombar .invite .namefield input { flex: none; width: 11em; min-width: 0; max-width: 100%; font: inherit; }
@media (prefers-color-scheme: dark) {
  .chip.you { background: #22345a; color: #cfe0ff; }
  .chip.agent { background: #3a2a55; color: #e6d5ff; }
}
`;
