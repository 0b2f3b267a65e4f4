"""What the platforms' adapters share, whichever platform they bind the API's ports to.

``link_transport.LinkTransport`` runs the peer links (``weei.core.links``) on
asyncio for the agent's aiortc adapter and the page's ``RTCPeerConnection``
adapter; ``worker_tasks.TaskBook`` is the bookkeeping between a host and its
Workers (slots, tags, cancellation) for the CPython thread pool
(``weei.host``) and the page's Web Workers (``weei.browser``). Neither is
part of the API (``weei.api``), which only names the ports they serve.
"""
