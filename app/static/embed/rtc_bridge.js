// The page's half of the WebRTC bridge (weei.js imports this module at the host worker's first `rtc`
// message). A Worker has no RTCPeerConnection: the host worker's stand-ins (embed/rtc_worker.js) ask for
// each operation here, and every event of the real objects goes back to them. Frames move as transferred
// ArrayBuffers in both directions, one per data-channel message: nothing is copied on the way.
//
// Messages from the worker: {type: 'rtc', op, pc | ch, req?, ...}; to it: {type: 'rtc', event, ...}.
// `req` numbers an operation that answers ({event: 'reply', req, ok, value | error}).

/** The bridge: handle(message) runs one operation; post(message, transfer) sends to the host worker. */
export function rtcBridge(post) {
  const pcs = new Map();
  const channels = new Map();
  let nextChannel = -1; // channels the other side opened get negative IDs; the worker's own are positive
  const sent = new Map(); // channel ID -> bytes handed to send() so far
  const polling = new Set(); // channels whose bufferedAmount is watched until it is 0

  const reply = (req, promise) => promise.then(
    (value) => post({ type: 'rtc', event: 'reply', req, ok: true, value }),
    (err) => post({ type: 'rtc', event: 'reply', req, ok: false, error: String(err && err.message || err) }));

  // How much of what the worker sent is still buffered: the worker's estimate is these bytes plus what
  // it sent after this report (docs/architecture.md "The host worker").
  function report(ch) {
    const channel = channels.get(ch);
    if (!channel) return;
    const buffered = channel.readyState === 'open' ? channel.bufferedAmount : 0;
    post({ type: 'rtc', event: 'buffered', ch, acked: sent.get(ch) || 0, buffered });
    if (buffered > 0 && !polling.has(ch)) {
      polling.add(ch);
      setTimeout(() => { polling.delete(ch); report(ch); }, 50);
    }
  }
  const scheduled = new Set();
  function reportSoon(ch) {
    if (scheduled.has(ch)) return;
    scheduled.add(ch);
    setTimeout(() => { scheduled.delete(ch); report(ch); }, 0);
  }

  const owner = new Map(); // channel ID -> its peer connection's ID
  function forget(ch) {
    channels.delete(ch);
    sent.delete(ch);
    owner.delete(ch);
  }

  function bind(pcId, ch, channel) {
    channels.set(ch, channel);
    sent.set(ch, 0);
    owner.set(ch, pcId);
    channel.binaryType = 'arraybuffer';
    channel.onopen = () => post({ type: 'rtc', event: 'open', ch });
    channel.onclose = () => {
      forget(ch);
      post({ type: 'rtc', event: 'close', ch });
    };
    channel.onerror = (e) => post({ type: 'rtc', event: 'error', ch, message: String(e && e.error && e.error.message || '') });
    channel.onmessage = (e) => post({ type: 'rtc', event: 'message', ch, data: e.data },
      e.data instanceof ArrayBuffer ? [e.data] : []);
    channel.onbufferedamountlow = () => report(ch);
  }

  return function handle(m) {
    const pc = pcs.get(m.pc);
    switch (m.op) {
      case 'create': {
        const made = new RTCPeerConnection(m.config);
        pcs.set(m.pc, made);
        made.onicecandidate = (e) => post({ type: 'rtc', event: 'icecandidate', pc: m.pc,
                                            candidate: e.candidate ? e.candidate.toJSON() : null });
        made.onconnectionstatechange = () => post({ type: 'rtc', event: 'connectionstatechange', pc: m.pc,
                                                    state: made.connectionState });
        made.ondatachannel = (e) => {
          const ch = nextChannel--;
          bind(m.pc, ch, e.channel);
          post({ type: 'rtc', event: 'datachannel', pc: m.pc, ch, label: e.channel.label, readyState: e.channel.readyState });
        };
        return;
      }
      case 'createDataChannel':
        bind(m.pc, m.ch, pc.createDataChannel(m.label, m.options));
        return;
      case 'createOffer':
        reply(m.req, pc.createOffer().then((d) => ({ type: d.type, sdp: d.sdp })));
        return;
      case 'createAnswer':
        reply(m.req, pc.createAnswer().then((d) => ({ type: d.type, sdp: d.sdp })));
        return;
      case 'setLocalDescription':
        reply(m.req, pc.setLocalDescription(m.desc).then(() => pc.localDescription && {
          type: pc.localDescription.type, sdp: pc.localDescription.sdp }));
        return;
      case 'setRemoteDescription':
        reply(m.req, pc.setRemoteDescription(m.desc).then(() => null));
        return;
      case 'addIceCandidate':
        reply(m.req, pc.addIceCandidate(m.init).then(() => null));
        return;
      case 'close':
        if (pc) {
          pc.onicecandidate = pc.onconnectionstatechange = pc.ondatachannel = null;
          pc.close();
          pcs.delete(m.pc);
          for (const [ch, pcId] of owner) {
            if (pcId === m.pc) forget(ch);
          }
        }
        return;
      case 'send': {
        const channel = channels.get(m.ch);
        if (!channel) return;
        sent.set(m.ch, (sent.get(m.ch) || 0) + (typeof m.data === 'string' ? m.data.length : m.data.byteLength));
        try {
          channel.send(m.data);
        } catch (err) { // closed meanwhile: the worker hears the close event
          console.warn('[weei] a data channel refused a frame:', err);
        }
        reportSoon(m.ch);
        return;
      }
      case 'threshold': {
        const channel = channels.get(m.ch);
        if (channel) channel.bufferedAmountLowThreshold = m.value;
        return;
      }
      case 'closeChannel': {
        const channel = channels.get(m.ch);
        if (channel) channel.close(); // its close event (forget) follows
        return;
      }
      default:
        console.warn('[weei] unknown rtc operation', m.op);
    }
  };
}
