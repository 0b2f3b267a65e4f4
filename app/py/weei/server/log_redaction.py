"""What the HTTP server logs of a request it could not parse: one line, never the request itself.

aiohttp logs a request it cannot parse (a bad method, a control character,
a line over its limit) at ERROR with a traceback whose message quotes the
raw request line, query string included. A room key in a ``?room=`` query
(docs/signaling.md, "Rooms and keys") would reach the log that way, and a
client could write a traceback per request. The filter keeps the record
(its level and the peer's address) and drops the rest: the exception's
class and HTTP status stand in for the quoted bytes.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["RedactParserErrors", "redact_parser_errors"]

_LOGGER = "aiohttp.server"


class RedactParserErrors(logging.Filter):
    """Rewrites a record about an unparsable request into one line without the request's text."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {type(exc).__name__} {exc.code} (request not shown)"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


def redact_parser_errors() -> None:
    """Install the filter on aiohttp's server logger (once per process)."""
    logger = logging.getLogger(_LOGGER)
    if not any(isinstance(f, RedactParserErrors) for f in logger.filters):
        logger.addFilter(RedactParserErrors())
