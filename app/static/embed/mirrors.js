// What the host worker publishes, held on the page (weei.js imports this module when the API starts;
// docs/browser.md "The host worker"). The controller runs in the host worker, and the API's synchronous
// methods cannot wait for it: getState() and they answer from here, at once.
//
// The host worker sends one `publish` message per PageApi.publish(): the state (JSON text) and the mirrors
// that changed with it — the debug log (getDebugLog()'s JSON and the text localStorage keeps), the latest
// checkpoint and the module (envelopes whose file is a File: it crossed by reference) and invite()'s refusal
// for each connected peer and any other. It also sends each write of its Web Storage mirror (`storage`).

// The debug log's key in localStorage (weei.api.log_writer.DEBUG_LOG_KEY), under the tab's namespace.
const DEBUG_LOG_KEY = 'weei.debugLog';
// page_api.UNKNOWN_PEER: the peer the refusal for any other peer names.
const UNKNOWN_PEER = '\u0000peer';
// A remote peer's diagnostics are stale past this age (weei.core.observe.diagnostics.records.STALE_AFTER_MS).
const STALE_AFTER_MS = 10000;

const storeOf = (area) => (area === 'local' ? localStorage : sessionStorage);

/** weei's keys of a Storage (`local` or `session`): the host worker's mirror starts from them. */
export function storageEntries(area) {
  const out = {};
  try {
    const store = storeOf(area);
    for (let i = 0; i < store.length; i++) {
      const key = store.key(i);
      if (key && key.includes('weei')) out[key] = store.getItem(key);
    }
  } catch { /* no storage here (a sandboxed frame): the mirror starts empty */ }
  return out;
}

// A write of the host worker's mirror. One that does not fit (QuotaExceededError) or a storage the browser
// disabled does not stop a job: reported once (as weei.browser.local_storage did in the page).
let storageFailures = 0;
function applyStorage({ area, key, value }) {
  try {
    if (value === null) storeOf(area).removeItem(key);
    else storeOf(area).setItem(key, value);
  } catch (err) {
    if (storageFailures++ === 0) console.warn(`[weei] ${area}Storage refused ${key} (${value && value.length} characters):`, err);
  }
}

// The spec's diagnostics ageMs is "local time since receivedAt, at getState()" (weei.core.observe.diagnostics.book.view):
// the published copy may be a second old, so each peer's age is taken again; this peer's own entry is always
// fresh (state_view._diagnostics).
function ageDiagnostics(state) {
  const now = Date.now();
  for (const [peer, record] of Object.entries(state.diagnostics || {})) {
    if (!record || typeof record.receivedAt !== 'number') continue;
    if (peer === state.myPeerId) {
      record.receivedAt = now;
      continue;
    }
    record.ageMs = Math.max(0, now - record.receivedAt);
    record.stale = record.ageMs > STALE_AFTER_MS || !record.connected;
  }
  return state;
}

/**
 * The page's copy of one controller. host: weei.js's host worker client; namespace: the tab's storage
 * namespace; weeiError, unwrap: weei.js's; onState(state): each published state (to the subscribers).
 */
export function hostMirrors({ host, namespace, weeiError, unwrap, onState }) {
  let stateJson = null;
  const mirrors = { debugLog: null, checkpoint: null, module: null, invite: null };
  let debugLogChanged = false;
  let clearing = 0; // clearDebugLog() calls the host worker has not answered yet: its older logs are stale
  const debugLogKey = `${namespace ? namespace + ':' : ''}${DEBUG_LOG_KEY}`;

  function onMessage(message) {
    if (message.type === 'publish') { // the mirrors and the state they go with
      for (const { name, value } of message.mirrors) {
        if (name === 'debugLog' && clearing) continue;
        mirrors[name] = name === 'invite' ? JSON.parse(value) : value;
        if (name === 'debugLog') debugLogChanged = true;
      }
      if (message.state !== null) {
        stateJson = message.state;
        onState(stateJson);
      }
    } else if (message.type === 'opened') {
      stateJson = message.json;
    } else if (message.type === 'storage') {
      // Writes of the log sent before a clearDebugLog() reached the controller would bring it back.
      if (!(clearing && message.key === debugLogKey)) applyStorage(message);
    }
  }

  // The controller writes the debug log to localStorage at most every 2 s: what the last seconds added is
  // written here when the page is hidden or goes away (a message to the host worker would come too late).
  function writeDebugLog() {
    if (!debugLogChanged) return;
    debugLogChanged = false;
    applyStorage({ area: 'local', key: debugLogKey, value: mirrors.debugLog.stored });
  }
  window.addEventListener('pagehide', writeDebugLog);
  document.addEventListener('visibilitychange', writeDebugLog);

  function debugLog() {
    const log = JSON.parse(mirrors.debugLog.file);
    log.exportedAt = new Date().toISOString();
    return log;
  }

  return {
    onMessage,
    /** getState(): a copy of the last published state (null before the first). */
    state: () => (stateJson === null ? null : ageDiagnostics(JSON.parse(stateJson))),
    checkpoint: () => unwrap(mirrors.checkpoint),
    module: () => unwrap(mirrors.module),
    debugLog,

    // invite(peerId): refused here by the refusal the controller published for that peer (check_invite: the
    // checks invite() makes); allowed, it goes to the controller, which sends the invitation.
    invite(peerId) {
      if (typeof peerId !== 'string') throw weeiError('invalid-argument', 'the peer id must be a string');
      const refusals = mirrors.invite;
      const refusal = Object.prototype.hasOwnProperty.call(refusals.peers, peerId) ? refusals.peers[peerId]
        : refusals.other && { ...refusals.other, message: refusals.other.message.split(UNKNOWN_PEER).join(peerId) };
      if (refusal) throw weeiError(refusal.reason, refusal.message, refusal.kind);
      // The peer left in the instant since the controller's last word: its refusal goes to the console.
      host.request({ type: 'callSync', name: 'invite', args: JSON.stringify({ peerId }) })
        .then((reply) => unwrap(reply.envelope))
        .catch((err) => console.warn(`[weei] invite(${peerId}) was refused:`, err));
      return undefined;
    },

    // clearDebugLog(): the log is empty here at once, and so is its stored copy (a missing copy reads as an
    // empty log); the controller then clears its own and writes the empty log.
    clearDebugLog() {
      const log = JSON.parse(mirrors.debugLog.file);
      const empty = { ...log, baseline: { phases: {}, idle: { samples: 0, totalMs: 0, avgMs: 0 } }, events: [] };
      mirrors.debugLog = { file: JSON.stringify(empty), stored: null };
      debugLogChanged = false;
      applyStorage({ area: 'local', key: debugLogKey, value: null });
      clearing += 1;
      host.request({ type: 'callSync', name: 'clearDebugLog', args: '{}' }).then((reply) => {
        clearing -= 1;
        if (!clearing) mirrors.debugLog = reply.debugLog;
      });
      return undefined;
    },
  };
}
