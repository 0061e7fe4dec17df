"""npud's logging: text or structured JSON (one object per line), and decision records.

Every decision the daemon carries out (request granted, unload asked and why,
revoked, completed) is logged through :func:`decision` with its fields as
structured data, so `journalctl -o cat | jq` can follow one request.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

DECISIONS = logging.getLogger("npumanager.decisions")

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _RESERVED and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """Human lines; the structured fields follow the message as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created))
        ms = int(record.msecs)
        extra = " ".join(
            f"{k}={v}"
            for k, v in record.__dict__.items()
            if k not in _RESERVED and not k.startswith("_")
        )
        line = f"{ts}.{ms:03d} {record.levelname.lower():7s} {record.name}: {record.getMessage()}"
        if extra:
            line += f"  [{extra}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure the root logger of the daemon process (replaces earlier handlers)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def decision(what: str, **fields: Any) -> None:
    """Log one decision with its fields as structured data."""
    if DECISIONS.isEnabledFor(logging.INFO):
        DECISIONS.info(what, extra={"decision": what, **fields})
