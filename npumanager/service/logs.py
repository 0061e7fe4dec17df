"""npud's and the driver hosts' logging: one format for both, text or JSON, journald-aware.

Every decision the daemon carries out (request granted, unload asked and why,
revoked, completed) is logged through :func:`decision` with its fields as
structured data, so `journalctl -o cat | jq` can follow one request.

Under systemd (``JOURNAL_STREAM`` names our stderr) each line starts with its
syslog priority as ``<N>`` (sd-daemon(3)), which journald strips and stores as
the entry's priority, and carries no timestamp: the journal has its own. Driver
hosts inherit npud's format and level (``NPU_LOG_FORMAT``/``NPU_LOG_LEVEL``)
and tag their lines ``driver[NAME]``, so both read as one stream.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

DECISIONS = logging.getLogger("npumanager.decisions")

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

#: Python level -> syslog priority (sd-daemon.h: SD_CRIT <2> .. SD_DEBUG <7>).
SYSLOG_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4,
                   logging.INFO: 6, logging.DEBUG: 7}


def priority(levelno: int) -> int:
    for level in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= level:
            return SYSLOG_PRIORITY[level]
    return SYSLOG_PRIORITY[logging.DEBUG]


def under_journald(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default stderr) is the journal stream systemd gave us:
    ``JOURNAL_STREAM`` is "DEV:INODE" of that fd (systemd.exec(5))."""
    value = os.environ.get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep:
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
        return st.st_dev == int(dev) and st.st_ino == int(ino)
    except (OSError, ValueError, AttributeError):
        return False


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items()
            if k not in _RESERVED and not k.startswith("_")}


class _Base(logging.Formatter):
    def __init__(self, tag: str = "", journal: bool = False) -> None:
        super().__init__()
        self.tag = tag
        self.journal = journal

    def _finish(self, record: logging.LogRecord, text: str) -> str:
        if not self.journal:
            return text
        # journald takes the <N> prefix per line: give every line of a traceback its level.
        prefix = f"<{priority(record.levelno)}>"
        return "\n".join(prefix + line for line in text.split("\n"))


class JsonFormatter(_Base):
    """One JSON object per line: ts, level, logger, msg, plus every ``extra`` field
    (``ts`` left out under journald, which timestamps each entry itself)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {}
        if not self.journal:
            out["ts"] = round(record.created, 6)
        out.update(level=record.levelname.lower(), logger=record.name, msg=record.getMessage())
        if self.tag:
            out["process"] = self.tag
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return self._finish(record, json.dumps(out, default=str))


class TextFormatter(_Base):
    """Human lines; the structured fields follow the message as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        who = f"{self.tag} {record.name}" if self.tag else record.name
        line = f"{record.levelname.lower():7s} {who}: {record.getMessage()}"
        if not self.journal:
            ts = time.strftime("%H:%M:%S", time.localtime(record.created))
            line = f"{ts}.{int(record.msecs):03d} {line}"
        if extra:
            line += f"  [{extra}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return self._finish(record, line)


def make_formatter(fmt: str = "text", *, tag: str = "", journal: bool = False) -> _Base:
    return JsonFormatter(tag, journal) if fmt == "json" else TextFormatter(tag, journal)


def setup_logging(fmt: str = "text", level: str = "info", stream: TextIO | None = None,
                  *, tag: str = "") -> None:
    """Configure the root logger of the process (replaces earlier handlers)."""
    out = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(make_formatter(fmt, tag=tag, journal=under_journald(out)))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


def decision(what: str, **fields: Any) -> None:
    """Log one decision with its fields as structured data."""
    if DECISIONS.isEnabledFor(logging.INFO):
        DECISIONS.info(what, extra={"decision": what, **fields})
