"""Logging with the session id on every line, as text or JSON lines.

The id lives in a context variable set when a session is created; the tasks that serve the
session (ours, and aiortc's and aioice's, created while it is set up) inherit it, so their log
records carry it too. Lines outside any session show "-".
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar

SESSION_ID: ContextVar[str] = ContextVar("session_id", default="-")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(session_id)s] %(message)s"
# Libraries that log every ICE check and state change at INFO: their lines would drown the server's
# own. They speak from WARNING up, or everything at --log-level debug.
CHATTY_LIBRARIES = ("aioice", "aiortc")


class SessionIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.session_id = SESSION_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, session_id, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "session_id": getattr(record, "session_id", "-"),
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(SessionIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else max(logging.WARNING, handler.level))
