"""The agent: a Weei participant that runs on a server (aiortc + wasmtime + files), no browser.

``weei agent --server URL --room CODE --accept-model SHA256`` joins a room and
trains the jobs it is allowed to accept (``policy.py``), over WebRTC
(``transport.py``, docs/peers.md), keeping its records on disk
(``storage.py``).
"""
