// This tab's storage slot and local peer ID, each held by a Web Lock for the tab's lifetime
// (weei.js imports this module when the API starts; docs/api.md "Tabs").
//
// Each tab is its own peer with its own storage namespace: slot 0 is the IndexedDB database `weei`
// (and the bare localStorage keys), slot N the database `weei-tab-N` (keys prefixed `weei-tab-N:`).
// The lock means two controllers never continue the same saved job; the tab keeps its slot across
// reloads (sessionStorage), and a new tab takes the lowest free one (so a tab opened after the others
// closed finds the saved jobs of slot 0). A duplicated tab starts with a copy of the original's
// sessionStorage: it finds the remembered slot and peer ID held by the original and takes its own.

const SLOT_KEY = 'weei.tabSlot';
const slotLock = (n) => `weei.distributed-training.slot-${n}`;
const peerLock = (peerId) => `weei.distributed-training.peer-${peerId}`;

/** The storage namespace of slot n: '' (the database `weei`) for slot 0, else `weei-tab-N`. */
export const namespaceOf = (n) => (n === 0 ? '' : `weei-tab-${n}`);

const hasLocks = () => Boolean(navigator.locks && typeof navigator.locks.request === 'function');

// true: held for the tab's lifetime; false: taken (or waited long enough: AbortSignal.timeout rejects
// with a TimeoutError); null: no locks here (a sandboxed frame).
function tryHold(name, options) {
  const forever = () => new Promise(() => {});
  return new Promise((answer) => {
    navigator.locks.request(name, options, (lock) => {
      answer(Boolean(lock));
      return lock ? forever() : undefined;
    }).catch((err) => answer(err && (err.name === 'AbortError' || err.name === 'TimeoutError') ? false : null));
  });
}

// Waits for a lock the tab's previous document held: a reload's old document lets go as it unloads, which
// a loaded machine can delay by seconds, and a reload that gave up would lose its saved job to a fresh
// slot. Only a duplicated tab (whose original keeps the lock) pays the whole wait.
const RELOAD_WAIT_MS = 5000;
const waitForRelease = () => (typeof AbortSignal.timeout === 'function' ? { signal: AbortSignal.timeout(RELOAD_WAIT_MS) } : { ifAvailable: true });

async function holdSlot() {
  let remembered = null;
  try { remembered = Number.parseInt(sessionStorage.getItem(SLOT_KEY), 10); } catch { /* no sessionStorage */ }
  const mine = Number.isInteger(remembered) && remembered >= 0 ? remembered : null;
  const keep = (n) => {
    try { sessionStorage.setItem(SLOT_KEY, String(n)); } catch { /* no sessionStorage */ }
    return n;
  };
  // Without Web Locks (not a secure context) there is no guard: the remembered slot, else 0.
  if (!hasLocks()) return keep(mine ?? 0);
  // A reload: wait a little for our slot. A duplicated tab: the original still holds it; take another.
  if (mine !== null) {
    const held = await tryHold(slotLock(mine), waitForRelease());
    if (held !== false) return keep(mine); // held, or unguarded
  }
  for (let n = 0; ; n += 1) {
    const held = n === mine ? false : await tryHold(slotLock(n), { ifAvailable: true });
    if (held) return keep(n);
    if (held === null) {
      console.warn('[weei] no Web Locks here: this tab shares its storage with other tabs');
      return keep(mine ?? 0);
    }
  }
}

// The local peer ID (a tab without a room: a room's signaling server names the peer) under its lock;
// taken by another tab (this one is a duplicate), newPeerId() makes and remembers another.
async function holdPeerId(peerId, newPeerId) {
  if (!peerId || !hasLocks()) return peerId;
  if (await tryHold(peerLock(peerId), waitForRelease()) !== false) return peerId;
  const fresh = newPeerId();
  if (fresh) await tryHold(peerLock(fresh), { ifAvailable: true });
  return fresh;
}

/**
 * Hold this tab's slot and (without a room: peerId not '') its local peer ID; resolves {slot, peerId}.
 * Resolved before the page's Python reads the peer ID (page_main._peer_id reads the same sessionStorage key).
 */
export async function holdTab({ peerId, newPeerId }) {
  const [slot, held] = await Promise.all([holdSlot(), holdPeerId(peerId, newPeerId)]);
  return { slot, peerId: held };
}
