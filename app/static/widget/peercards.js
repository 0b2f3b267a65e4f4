// A compact card per peer above the diagnostics table (issue 24, item 10): who, doing what, how fast,
// its last round's time, which one is the slowest, and which one has not reported for a while.
// Pure builders over getState(); the window's Diagnostics section places them.

import { h, fmtNum, fmtMs, fmtDuration } from './dom.js';
import { peerName } from './names.js';

/** A speed in one format: whole and grouped from 100 up ("14,300"), 3 significant digits below ("42.7"). */
export const fmtRate = (v) => (v >= 100 ? Math.round(v).toLocaleString('en-US') : fmtNum(v, 3));

// A peer whose diagnostics are older than this is said "not responding".
export const SILENT_MS = 60000;

/** Per-peer facts for the cards: [{peer, stage, rate, roundMs, silentMs, slowest}], by peer ID. */
export function peerFacts(state, ended) {
  const diag = state.diagnostics || {};
  const facts = Object.entries(diag).map(([peer, d]) => {
    const p = d.performance || {};
    const t = d.timings || {};
    const rate = typeof p.averageExamplesPerSecond === 'number' ? p.averageExamplesPerSecond
      : typeof p.currentExamplesPerSecond === 'number' ? p.currentExamplesPerSecond : null;
    const roundMs = ['preparationMs', 'compilationMs', 'trainingMs', 'uploadMs']
      .map((k) => t[k]).filter((v) => typeof v === 'number').reduce((a, b) => a + b, 0) || null;
    const silentMs = !ended && d.stale && typeof d.ageMs === 'number' && d.ageMs >= SILENT_MS ? d.ageMs : null;
    return { peer, stage: ended && d.stage !== 'error' ? 'finished' : d.stage || 'unknown', rate, roundMs, silentMs,
      connected: d.connected !== false, error: d.error || null, slowest: false };
  });
  const rated = facts.filter((f) => f.rate !== null);
  if (rated.length > 1) rated.reduce((a, b) => (b.rate < a.rate ? b : a)).slowest = true;
  return facts.sort((a, b) => (a.peer < b.peer ? -1 : 1));
}

/** The cards' element. */
export function peerCardsView(state, ended, unit = 'examples') {
  const facts = peerFacts(state, ended);
  return h('div', { class: 'pcards', role: 'list', 'aria-label': 'Peers, one card each' }, facts.map((f) => {
    const flags = [
      f.slowest ? h('span', { class: 'chip warn', text: 'slowest' }) : null,
      f.silentMs ? h('span', { class: 'chip error', text: `not responding for ${fmtDuration(f.silentMs).replace(/ \d+ s$/, '')}` }) : null,
      !f.connected ? h('span', { class: 'chip error', text: 'disconnected' }) : null,
    ];
    return h('div', { class: 'pcard', role: 'listitem', 'data-peer': f.peer },
      h('div', { class: 'pcard-head' }, peerName(state, f.peer)),
      h('div', { class: 'pcard-row' }, h('span', { class: `chip ${f.stage === 'error' ? 'error' : f.stage === 'training' ? 'training' : f.stage === 'finished' ? 'completed' : ''}`, text: f.stage }), ...flags),
      h('div', { class: 'pcard-row small' },
        h('span', { 'data-field': 'rate', text: f.rate === null ? '— /s' : `${fmtRate(f.rate)} ${unit}/s` }),
        h('span', { class: 'muted', 'data-field': 'roundTime', text: f.roundMs === null ? 'no round yet' : `last round ${fmtMs(f.roundMs)}` })),
      f.error ? h('div', { class: 'sub wrap', text: f.error }) : null);
  }));
}

export const PEERCARDS_CSS = `
.pcards { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 6px; margin: 6px 0 8px; }
.pcard { border: 1px solid var(--card-border); background: var(--card-bg); border-radius: 8px; padding: 6px 8px; min-width: 0; }
.pcard-head { margin-bottom: 3px; overflow: hidden; }
.pcard-row { display: flex; gap: 6px; flex-wrap: wrap; align-items: center; margin: 2px 0; }
.chip.warn { background: var(--chip-warn-bg); color: var(--chip-warn-fg); }
table.diagnostics th:first-child, table.diagnostics td:first-child { position: sticky; left: 0; z-index: 1; background: var(--bg); }
table.diagnostics th:first-child { background: var(--th-bg); }
`;
