// The landing page (index.html): the room, the embed snippet and the developer section.
'use strict';
const $ = (id) => document.getElementById(id);
const embed = new URL('weei.js', location.href).href;
// The same two tags as README and `weei serve` print (weei.server.invite.embed_snippet), in this page's room.
const snippet = (key) => `<script src="${embed}" data-room="${key}"></` + 'script>\n'
  + `<script>weeiReady.then((weei) => weei.widgetsApi.get('distributed-training').enable())</` + 'script>';
$('embed').textContent = snippet('KEY');

// A fresh room key: 16 random bytes in base64url (22 characters), as `weei serve` makes them.
function freshKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

weeiReady.then((weei) => {
  const api = weei.widgetsApi.get('distributed-training');
  const room = api.getRoom();
  $(room ? 'in-room' : 'no-room').classList.remove('hidden');
  if (room) {
    $('room-key').textContent = room.key;
    $('embed').textContent = snippet(room.key);
    $('invite-link').value = room.invite;
    $('invite-link').addEventListener('focus', (e) => e.target.select());
    $('copy-invite').onclick = async () => {
      $('invite-link').select();
      try {
        await navigator.clipboard.writeText(room.invite);
        $('copy-invite').textContent = 'Copied';
      } catch {
        $('copy-invite').textContent = 'Press Ctrl+C';
      }
      setTimeout(() => { $('copy-invite').textContent = 'Copy invite link'; }, 1600);
    };
  } else {
    // The page reads its room when it loads: a new key in the fragment, then a reload.
    $('new-room').onclick = (e) => {
      e.preventDefault();
      location.hash = `room=${freshKey()}`;
      location.reload();
    };
  }

  const dev = $('developer');
  let latest = api.getState();
  let extra = {}; // the test run's result (or error), shown beside the state
  const showDev = () => {
    if (dev.open) $('state').textContent = JSON.stringify({ ...latest, ...extra }, null, 2);
  };
  const showPeer = () => {
    $('peer-id').textContent = latest.myPeerId || (latest.error ? latest.error : 'connecting…');
  };
  api.subscribe((state) => { latest = state; showPeer(); showDev(); });
  dev.addEventListener('toggle', () => showDev());

  const open = $('open');
  open.disabled = typeof api.enable !== 'function';
  open.onclick = () => api.enable().catch((err) => { $('open-note').textContent = String(err && err.message || err); });

  // The test run uses the test hooks, which only a server started with --test-hooks turns on.
  const train = $('train');
  if (!window.__weeiTestHooks) {
    train.parentElement.classList.add('hidden');
    return;
  }
  train.disabled = false;
  train.onclick = async () => {
    train.disabled = true;
    try {
      extra = { lastResult: await __weeiTestHooks.get('distributed-training').trainOnce('digits-mlp') };
    } catch (err) {
      extra = { error: String(err) };
    } finally {
      showDev();
      train.disabled = false;
    }
  };
});
