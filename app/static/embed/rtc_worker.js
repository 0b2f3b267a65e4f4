// The host worker's RTCPeerConnection and RTCDataChannel: stand-ins with the part of the W3C API that
// weei.browser.rtc uses, each operation done by the real object on the page (embed/rtc_bridge.js). host.js
// installs them as globalThis.RTCPeerConnection, so rtc.py is the same code in a Worker and on a page.
//
// What the page knows is mirrored here as it arrives: connectionState, a channel's readyState and
// localDescription. A channel's bufferedAmount is the page's last report plus what was sent after it
// (never less than the page's real amount, so backpressure holds); bufferedamountlow fires here when that
// estimate falls to the threshold, as a real channel's does.

export function rtcStandIns(post) {
  const pcs = new Map();
  const channels = new Map();
  const requests = new Map();
  let nextPc = 1;
  let nextChannel = 1;
  let nextReq = 1;

  function request(op, fields) {
    const req = nextReq++;
    return new Promise((resolve, reject) => {
      requests.set(req, { resolve, reject });
      post({ type: 'rtc', op, req, ...fields });
    });
  }

  const fire = (target, name, event) => {
    const handler = target[name];
    if (typeof handler === 'function') handler(event);
  };

  class DataChannel {
    constructor(id, label, readyState) {
      this.id = id;
      this.label = label;
      this.readyState = readyState;
      this.binaryType = 'arraybuffer'; // the page's channel always delivers ArrayBuffers
      this._threshold = 0;
      this._sent = 0; // bytes given to send()
      this._acked = 0; // of those, what the page had handed to its channel at its last report
      this._reported = 0; // the page's bufferedAmount at that report
      this.onopen = this.onmessage = this.onclose = this.onerror = this.onbufferedamountlow = null;
      channels.set(id, this);
    }
    get bufferedAmount() { return this._reported + (this._sent - this._acked); }
    get bufferedAmountLowThreshold() { return this._threshold; }
    set bufferedAmountLowThreshold(value) {
      this._threshold = value;
      post({ type: 'rtc', op: 'threshold', ch: this.id, value });
    }
    send(data) {
      if (this.readyState !== 'open') throw new DOMException(`the data channel is ${this.readyState}`, 'InvalidStateError');
      let transfer = [];
      if (typeof data !== 'string') {
        // Python's to_uint8array makes an array of its own: its buffer moves to the page uncopied.
        const view = ArrayBuffer.isView(data) ? data : new Uint8Array(data);
        const whole = view.byteOffset === 0 && view.byteLength === view.buffer.byteLength;
        data = whole ? view.buffer : view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
        transfer = [data];
        this._sent += data.byteLength;
      } else {
        this._sent += data.length;
      }
      post({ type: 'rtc', op: 'send', ch: this.id, data }, transfer);
    }
    close() {
      if (this.readyState === 'closed') return;
      this.readyState = 'closing';
      post({ type: 'rtc', op: 'closeChannel', ch: this.id });
    }
    _buffered({ acked, buffered }) {
      const before = this.bufferedAmount;
      this._acked = acked;
      this._reported = buffered;
      if (before > this._threshold && this.bufferedAmount <= this._threshold) fire(this, 'onbufferedamountlow', {});
    }
  }

  class PeerConnection {
    constructor(config) {
      this.id = nextPc++;
      this.connectionState = 'new';
      this.localDescription = null;
      this.onicecandidate = this.onconnectionstatechange = this.ondatachannel = null;
      pcs.set(this.id, this);
      post({ type: 'rtc', op: 'create', pc: this.id, config: config ? JSON.parse(JSON.stringify(config)) : {} });
    }
    createDataChannel(label, options) {
      const channel = new DataChannel(nextChannel++, String(label), 'connecting');
      channel.pc = this.id;
      post({ type: 'rtc', op: 'createDataChannel', pc: this.id, ch: channel.id, label: String(label),
             options: options ? { ...options } : {} });
      return channel;
    }
    createOffer() { return request('createOffer', { pc: this.id }); }
    createAnswer() { return request('createAnswer', { pc: this.id }); }
    async setLocalDescription(desc) {
      this.localDescription = await request('setLocalDescription', { pc: this.id, desc: { type: desc.type, sdp: desc.sdp } });
    }
    setRemoteDescription(desc) { return request('setRemoteDescription', { pc: this.id, desc: { type: desc.type, sdp: desc.sdp } }); }
    addIceCandidate(init) { return request('addIceCandidate', { pc: this.id, init: init ? JSON.parse(JSON.stringify(init)) : init }); }
    close() {
      if (this.connectionState === 'closed') return;
      this.connectionState = 'closed';
      for (const [id, channel] of channels) {
        if (channel.pc === this.id) {
          channel.readyState = 'closed';
          channels.delete(id);
        }
      }
      pcs.delete(this.id);
      post({ type: 'rtc', op: 'close', pc: this.id });
    }
  }

  /** One message of the page's half ({type: 'rtc', event, ...}). */
  function handle(m) {
    if (m.event === 'reply') {
      const entry = requests.get(m.req);
      requests.delete(m.req);
      if (entry) (m.ok ? entry.resolve(m.value) : entry.reject(new Error(m.error)));
      return;
    }
    const pc = pcs.get(m.pc);
    const channel = channels.get(m.ch);
    switch (m.event) {
      case 'icecandidate':
        if (pc) fire(pc, 'onicecandidate', { candidate: m.candidate && { ...m.candidate, toJSON: () => m.candidate } });
        return;
      case 'connectionstatechange':
        if (pc) {
          pc.connectionState = m.state;
          fire(pc, 'onconnectionstatechange', {});
        }
        return;
      case 'datachannel':
        if (pc) {
          const made = new DataChannel(m.ch, m.label, m.readyState);
          made.pc = m.pc;
          fire(pc, 'ondatachannel', { channel: made });
        }
        return;
      case 'open':
        if (channel) {
          channel.readyState = 'open';
          fire(channel, 'onopen', {});
        }
        return;
      case 'message':
        if (channel) fire(channel, 'onmessage', { data: m.data });
        return;
      case 'close':
        if (channel) {
          channel.readyState = 'closed';
          channels.delete(m.ch);
          fire(channel, 'onclose', {});
        }
        return;
      case 'error':
        if (channel) fire(channel, 'onerror', { error: new Error(m.message) });
        return;
      case 'buffered':
        if (channel) channel._buffered(m);
        return;
      default:
        console.warn('[weei host] unknown rtc event', m.event);
    }
  }

  return { RTCPeerConnection: PeerConnection, handle };
}
