"""``weei serve``: the Weei server (aiohttp).

It serves the static site built by ``python build.py site`` (``dist/``) with
the headers an embedding page on another origin needs, and will carry the
WebSocket signaling of the peers. It never sees weights or data.
"""

from __future__ import annotations

from .app import MIME_TYPES, SITE_DIR_KEY, create_app, default_site_dir, run, serve

__all__ = ["MIME_TYPES", "SITE_DIR_KEY", "create_app", "default_site_dir", "run", "serve"]
