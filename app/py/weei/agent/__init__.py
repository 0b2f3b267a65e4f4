"""The agent: a Weei participant that runs on a server (aiortc + wasmtime + files), no browser.

``weei agent --room INVITE_LINK --accept-model SHA256 --trust-room`` joins a room and
trains the jobs it is allowed to accept (``policy.py``, docs/agent.md), over WebRTC
(``transport.py``, docs/peers.md), keeping its records on disk
(``storage.py``).
"""
