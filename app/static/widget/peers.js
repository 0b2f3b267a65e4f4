// The window's Peers & invitations section.
// Methods of the window's Widget class (mixed into it by window.js): `this` is the Widget.

import { h, append, show, fmtBytes, experienceOf, copyButton } from './dom.js';
import { peerName, peerCard, activityText } from './names.js';
import { gpuSpeedNote } from './status.js';

// More idle peers than this fold into a "N idle peers" disclosure (stale tabs pile up in a room).
const SHOWN_IDLE = 3;

export class Peers {
  buildPeersDevice() {
    const d = (this.d = {});
    d.pause = h('input', { type: 'checkbox', name: 'pauseContribution' });
    d.workers = h('input', { type: 'number', name: 'maxLocalWorkers', min: 1, max: 64, step: 1, style: 'width:5em' });
    d.gpu = h('input', { type: 'number', name: 'gpuMemoryBudgetMiB', min: 0, step: 64, style: 'width:7em' });
    d.backend = h('select', { name: 'backendPreference' }, ['auto', 'cpu', 'gpu', 'hybrid'].map((v) => h('option', { value: v, text: v })));
    d.error = h('div', { class: 'error hidden', role: 'alert' });
    d.line = h('p', { class: 'small muted' });
    d.pause.addEventListener('change', () => this.act(null, d.error, () => this.api.pauseContribution(d.pause.checked)));
    d.workers.addEventListener('change', () => this.act(null, d.error, () => this.api.setMaxLocalWorkers(Number(d.workers.value))));
    d.gpu.addEventListener('change', () => this.act(null, d.error, () => this.api.setGpuMemoryBudgetMiB(Number(d.gpu.value))));
    d.backend.addEventListener('change', () => this.act(null, d.error, () => this.api.setBackendPreference(d.backend.value)));
    d.peersBox = h('div');
    d.partsBox = h('div');
    d.invBox = h('div');
    append(this.sections.peers.content, d.peersBox, d.partsBox, d.invBox,
      h('h3', { text: 'This device' }),
      h('div', { class: 'row' },
        h('label', {}, d.pause, 'Pause my contribution'),
        h('label', {}, 'Workers per device ', d.workers),
        h('label', {}, 'GPU budget (MiB) ', d.gpu),
        h('label', {}, 'Backend ', d.backend)),
      d.line, d.error);
  }

  // The room bar under the window's title: the room, this peer's ID, the invite link and its Copy
  // button (the key is in the link's fragment), so nobody has to look for them.
  buildRoomBar() {
    const room = typeof this.api.getRoom === 'function' ? this.api.getRoom() : null;
    const r = (this.roomBar = { room });
    r.peer = h('span', { class: 'mono', 'data-field': 'myPeerId', text: '…' });
    r.copyPeer = copyButton(() => this.state && this.state.myPeerId, 'this browser\'s peer ID', { label: 'Copy ID', name: 'copyPeerId' });
    // This tab's display name: what the other peers and its invitations call it (setDisplayName).
    r.name = h('input', { type: 'text', name: 'displayName', maxlength: 48, 'aria-label': 'Your name in the room', placeholder: 'Your name' });
    r.nameError = h('span', { class: 'error hidden', role: 'alert' });
    r.name.addEventListener('change', () => this.act(null, r.nameError, () => this.api.setDisplayName(r.name.value)));
    r.nameRow = h('label', { class: 'namefield' }, h('span', { class: 'muted', text: 'Your name ' }), r.name);
    if (!room) {
      r.el = h('div', { class: 'roombar', 'data-room': '' },
        h('p', {}, h('b', { text: 'Not in a room' }), ': this browser trains alone. To train with others, open an invite link '
          + '(…/#room=KEY: `weei serve` prints one) here and in the other browsers.'),
        h('p', { class: 'row' }, h('span', { class: 'muted', text: 'This browser: ' }), r.peer, r.copyPeer, r.nameRow), r.nameError);
      return r.el;
    }
    const link = h('input', { type: 'text', name: 'inviteLink', readonly: true, value: room.invite, 'aria-label': 'Invite link' });
    link.addEventListener('focus', () => link.select());
    const copy = copyButton(room.invite, 'invite link', { label: 'Copy invite link', name: 'copyInvite', primary: true, select: link });
    r.el = h('div', { class: 'roombar', 'data-room': room.key },
      h('p', { class: 'row' }, h('span', { class: 'muted', text: 'Room' }),
        h('span', { class: 'mono', title: room.key, text: room.key.length > 12 ? room.key.slice(0, 10) + '…' : room.key }),
        h('span', { class: 'muted', text: '· this browser' }), r.peer, r.copyPeer),
      // The name shares the invite link's row: the bar stays as tall as it was.
      h('div', { class: 'row invite' }, link, copy, r.nameRow), r.nameError,
      h('p', { class: 'small muted', text: 'Anyone with this link joins the room (the key after # is its secret): '
        + 'open it in another tab, browser or machine, then invite that peer to a job.' }));
    return r.el;
  }

  renderRoomBar(state) {
    const r = this.roomBar;
    const me = state.myPeerId || '';
    r.peer.textContent = me || (r.room ? 'connecting…' : '…');
    r.peer.title = me;
    r.copyPeer.disabled = !me;
    if (this.root.activeElement !== r.name) r.name.value = state.displayName || '';
  }

  // An invitation raises a notice at the top of the window (and says so in a live region):
  // the invitation's card, with what the model is, sits in the Peers section, where Review leads.
  renderNotice(state) {
    const invitations = state.invitations || [];
    const ids = invitations.map(([id]) => id);
    this.seenInvitations = this.seenInvitations || new Set();
    const fresh = invitations.filter(([id]) => !this.seenInvitations.has(id));
    for (const id of ids) this.seenInvitations.add(id);
    if (fresh.length) {
      const [jobId, entry] = fresh[0];
      const inv = (entry && entry.invitation) || entry || {};
      this.live.textContent = `Invitation to train ${(inv.modelInfo && inv.modelInfo.name) || jobId}`
        + ` from ${inv.coordinatorName || inv.coordinator || 'a peer'}: review it at the top of the window.`;
    }
    this.section('notice', ids, () => invitations.map(([jobId, entry]) => {
      const inv = (entry && entry.invitation) || entry || {};
      const review = h('button', { type: 'button', class: 'primary', name: 'reviewInvitation', text: 'Review' });
      review.addEventListener('click', () => this.reviewInvitation(jobId));
      return h('div', { class: 'notice', 'data-job': jobId },
        h('span', {}, h('b', { text: 'Invitation' }), ` to train ${(inv.modelInfo && inv.modelInfo.name) || 'a model'} from `,
          h('b', { title: String(inv.coordinator || ''), text: String(inv.coordinatorName || (inv.coordinator || 'a peer').slice(0, 10)) }), '.'), review);
    }), this.noticeBox);
  }

  /** Open the Peers section and bring the invitation's card (its Accept button) into view. */
  reviewInvitation(jobId) {
    const sec = this.sections.peers;
    sec.el.open = true;
    const card = Array.from(sec.content.querySelectorAll('.invitation')).find((c) => c.dataset.job === jobId);
    if (!card) return;
    card.scrollIntoView({ block: 'center' });
    const accept = card.querySelector('button.primary');
    if (accept) accept.focus();
  }

  renderPeers(state, job) {
    const d = this.d;
    const focused = this.root.activeElement;
    if (focused !== d.workers) d.workers.value = state.maxLocalWorkers ?? '';
    if (focused !== d.gpu) d.gpu.value = state.gpuMemoryBudgetMiB ?? '';
    d.backend.value = state.backendPreference || 'auto';
    d.pause.checked = Boolean(state.pausedContribution);
    const ex = state.execution || {};
    const lw = job && job.localWorkers;
    d.line.textContent = `Workers running: ${show(state.activeWorkers)}`
      + (lw ? ` · this job can use ${lw.effective} (device allows ${lw.capacity})` : '')
      + ` · mode ${show(ex.actual)}${ex.fallback && ex.fallback !== 'none' ? ` (fallback: ${ex.fallback})` : ''}`
      + (gpuSpeedNote(ex) ? ` · ${gpuSpeedNote(ex)}` : '');

    const peers = state.peers || [];
    const participants = (job && job.participants) || {};
    const invitations = state.invitations || [];
    this.sections.peers.note.textContent = [peers.length ? `${peers.length} connected` : '',
      invitations.length ? `${invitations.length} invitation${invitations.length > 1 ? 's' : ''}` : ''].filter(Boolean).join(' · ');
    const coordinator = job && job.role === 'coordinator' && job.status !== 'completed';

    // Connected peers with their names and what each does, and Invite buttons: rebuilt only when who can be
    // invited, or what they say about themselves, changes. Idle peers past SHOWN_IDLE fold away.
    const why = inviteBlocked(job);
    const inviteKey = Object.entries(participants).map(([peer, p]) => [peer, p.state, p.approved, p.declined || '']);
    const names = state.peerNames || {};
    this.section('peers.list', [peers, coordinator, inviteKey, why, peers.map((p) => names[p] || null)], () => {
      const errorEl = h('div', { class: 'error hidden', role: 'alert' });
      const out = [h('h3', { text: 'Connected peers' })];
      if (!peers.length) {
        out.push(h('p', { class: 'small muted', text: this.roomBar.room
          ? 'No other browser in this room yet: send the invite link (Copy invite link, at the top) and open it there.'
          : 'Not in a room, so no other browser can connect: open an invite link to join one.' }));
      } else if (why) {
        out.push(h('p', { class: 'small muted', 'data-field': 'inviteHint', text: why }));
      }
      const row = (peer) => {
        const card = peerCard(state, peer);
        // Only a peer that takes part cannot be invited: an unanswered, declined or expired invitation can be sent again.
        const p = participants[peer];
        const invite = h('button', { type: 'button', name: 'invite', text: p && p.approved ? 'In this job' : p ? 'Invite again' : 'Invite',
          disabled: !coordinator || Boolean(p && p.approved),
          title: p && p.approved ? 'Already in this job' : (why || `Offer this job to ${card ? card.label : peer}`) });
        invite.addEventListener('click', () => this.act(invite, errorEl, () => this.api.invite(peer)));
        const said = p && p.state === 'invited' ? 'invited, waiting for an answer' : p && p.declined ? `declined: ${p.declined}` : '';
        const doing = activityText(card);
        return h('div', { class: 'peerrow', 'data-peer': peer },
          peerName(state, peer),
          h('span', { class: `small what ${doing ? '' : 'muted'}`, 'data-field': 'activity', text: doing || 'has not said who it is' }),
          said ? h('span', { class: 'small muted', 'data-field': 'inviteAnswer', text: said }) : null,
          invite);
      };
      // Busy peers and this job's first; idle and silent ones after, folded when there are many.
      const busy = peers.filter((p) => participants[p] || (peerCard(state, p) && peerCard(state, p).activity !== 'idle'));
      const idle = peers.filter((p) => !busy.includes(p));
      out.push(...busy.map(row), ...idle.slice(0, idle.length > SHOWN_IDLE ? 0 : SHOWN_IDLE).map(row));
      if (idle.length > SHOWN_IDLE) {
        out.push(h('details', { class: 'idlepeers' }, h('summary', { text: `${idle.length} idle peers` }), idle.map(row)));
      }
      out.push(errorEl);
      return out;
    }, d.peersBox);

    this.section('peers.parts', [job && job.id, participants, state.myPeerId, Object.keys(participants).map((p) => names[p] && names[p].label)], () => {
      const parts = Object.entries(participants);
      if (!job) return null;
      return [h('h3', { text: 'Participants' }),
        !parts.length ? h('p', { class: 'small muted', text: 'Nobody yet.' }) : h('div', { class: 'tablewrap' }, h('table', { class: 'participants' },
          h('thead', {}, h('tr', {}, ['Peer', 'State', 'Connected', 'Approved', 'Paused'].map((t) => h('th', { text: t })))),
          h('tbody', {}, parts.map(([peer, p]) => { const finished = job.status === 'completed' && p.state === 'stopped' && !p.missedEnd; return h('tr', {},
            h('td', {}, peerName(state, peer)),
            // A member of a finished job is 'stopped' in the spec's terms: said as success, not as a red stop.
            h('td', {}, h('span', { class: `chip ${finished ? 'completed' : p.state}`, text: finished ? 'finished' : p.state, title: p.state }),
              p.excluded ? h('span', { class: 'chip error', text: 'excluded', title: 'an outlier round after round (aggregation.excludeOutliersAfter)' }) : null,
              p.missedEnd ? h('div', { class: 'small muted', 'data-field': 'missedEnd', text: 'offline at the end: told when it reconnects' }) : null,
              p.stuck ? h('div', { class: 'small error', 'data-field': 'stuck', text: `stuck: ${p.stuck.reason}` }) : null,
              p.declined && p.state === 'declined' ? h('div', { class: 'small muted', text: p.declined }) : null),
            h('td', { text: p.connected ? 'yes' : 'no' }), h('td', { text: p.approved || finished ? 'yes' : 'no' }),
            h('td', { text: p.paused ? 'yes' : 'no' })); }))))];
    }, d.partsBox);

    this.section('peers.inv', invitations.map(([id]) => id), () => {
      const out = [h('h3', { text: 'Invitations' })];
      if (!invitations.length) out.push(h('p', { class: 'small muted', text: 'No pending invitation.' }));
      for (const [jobId, entry] of invitations) out.push(this.invitationCard(jobId, entry));
      return out;
    }, d.invBox);
  }

  /** What the participant sees before accepting: the model, its module and hash, the data size, the settings. */
  invitationCard(jobId, entry) {
    const inv = (entry && entry.invitation) || entry || {};
    const info = inv.modelInfo || {};
    const mod = inv.module || {};
    const s = inv.settings || {};
    const accept = h('button', { type: 'button', class: 'primary', text: 'Accept' });
    const decline = h('button', { type: 'button', text: 'Decline' });
    // A failed decision goes to the window's error banner, not into this card: the card goes away once the
    // invitation is gone, and a refused room proof declines it (the banner says why, until dismissed).
    accept.addEventListener('click', () => this.act(accept, null, () => this.api.decideInvitation(jobId, true)));
    decline.addEventListener('click', () => this.act(decline, null, () => this.api.decideInvitation(jobId, false)));
    const exp = experienceOf(info);
    // nesterov is a switch (0 or 1): named when on, left out when off.
    const agg = s.aggregation ? [s.aggregation.method, ...Object.entries(s.aggregation).filter(([k, x]) => k !== 'method' && !(k === 'nesterov' && !x))
      .map(([k, x]) => (k === 'nesterov' ? 'Nesterov' : `${k} ${x}`))].join(' ') : 'fedavg';
    const settingsText = [s.epochs !== undefined ? `${exp ? 'rounds' : 'epochs'} ${s.epochs}` : null,
      s.localEpochs !== undefined ? `local epochs ${s.localEpochs}` : null, s.batchSize !== undefined ? `batch ${s.batchSize}` : null,
      `learning rate ${s.learningRate !== undefined ? s.learningRate : 'model default'}`,
      s.experience ? `${s.experience.unitsPerAssignment} ${(exp && exp.unit && exp.unit.label || 'units').toLowerCase()} per round` : null,
      agg, s.compression ? `updates sent as ${s.compression.kind}, a scale per ${s.compression.block} weights${s.compression.deflate ? ', deflated' : ''}` : null].filter(Boolean).join(' · ');
    return h('div', { class: 'card invitation', 'data-job': jobId },
      h('dl', { class: 'kv' },
        h('dt', { text: 'Model' }), h('dd', { text: `${info.name || '—'} (${info.id || '—'} ${info.version || ''})` }),
        h('dt', { text: 'From' }), h('dd', { title: inv.coordinator || '' }, inv.coordinatorName ? h('b', { text: inv.coordinatorName }) : null,
          h('div', { class: 'mono small', text: inv.coordinator || '—' })),
        h('dt', { text: 'Module' }), h('dd', { text: `${mod.fileName || ''} ${fmtBytes(mod.bytes)}` }),
        h('dt', { text: 'SHA-256' }), h('dd', { class: 'mono', text: show(mod.sha256) }),
        h('dt', { text: 'Data' }), h('dd', { text: exp ? 'none: the model plays episodes' : fmtBytes(inv.dataBytes) }),
        h('dt', { text: 'Settings' }), h('dd', { text: settingsText }),
        ...privacyRow(entry && entry.privacy),
        h('dt', { text: 'Job' }), h('dd', { class: 'mono', text: jobId })),
      entry && entry.replacesFinishedJob ? h('p', { class: 'small', 'data-field': 'replaces',
        text: `Accepting replaces your finished job ${entry.replacesFinishedJob} in this window (it stays in Saved jobs).` }) : null,
      h('p', { class: 'small muted', text: 'Nothing is downloaded before you accept. Only use models you trust: the module runs in your browser.' }),
      h('div', { class: 'row' }, accept, decline));
  }
}

/** The invitation's privacy, as this browser computed it from the settings (core/job/invitations.py). */
function privacyRow(privacy) {
  if (!privacy) return [];
  const parts = [];
  if (privacy.invalid) parts.push(`invalid: ${privacy.invalid}`);
  const sa = privacy.secureAggregation;
  if (sa) parts.push(`secure aggregation: the coordinator sees only the sum (your update clipped to ${sa.clip}; threshold ${sa.threshold})`);
  const dp = privacy.dp;
  if (dp) parts.push(dp.plannedEpsilon === null ? `clipped to ${dp.clip}, no noise: no differential privacy`
    : `differential privacy ε ≤ ${Number(dp.plannedEpsilon).toPrecision(3)} at δ ${dp.delta} over at most ${dp.maxRounds} rounds (clip ${dp.clip}, noise ×${dp.noiseMultiplier}, ${dp.noiseAt === 'participants' ? 'added by each participant to its masked update' : 'added by the coordinator'})`);
  if (!parts.length) return [];
  return [h('dt', { text: 'Privacy' }), h('dd', { 'data-field': 'privacy', text: parts.join('; ') })];
}

/** Why Invite is disabled for this job (null when it is not). */
function inviteBlocked(job) {
  if (!job) return 'Invite offers a job to a peer: create one first (Job setup, e.g. a demo, then Create job).';
  if (job.role !== 'coordinator') return 'Only the job\'s coordinator invites; this browser takes part in it.';
  if (job.status === 'completed') return 'This job is completed: create a new job to invite peers.';
  return null;
}

// The room bar's and the notice's styles (the window's own are in styles.js).
export const ROOM_CSS = `
.roombar { padding: 6px 12px; background: #eef3fa; border-bottom: 1px solid #d5deea; font-size: 12.5px; }
.roombar p, .roombar .row { margin: 2px 0; }
.roombar .invite input { flex: 1; min-width: 12em; font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.notices { position: sticky; top: 0; z-index: 1; }
.notices:empty { display: none; }
.notice { display: flex; align-items: center; justify-content: space-between; gap: 8px; flex-wrap: wrap;
  margin: 6px 0; padding: 6px 10px; border-radius: 8px; background: #fff6dc; border: 1px solid #e8c96b; color: #4a3500; }
@media (prefers-color-scheme: dark) {
  .roombar { background: #1f2a3a; border-color: #34445c; }
  .notice { background: #3a300f; border-color: #8a6d1c; color: #fbe7a8; }
}
`;
