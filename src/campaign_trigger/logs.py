"""Log lines of the service's processes: plain text, or JSON lines (``CT_LOG_FORMAT=json``).

Every line carries ``request_id`` when it is written on behalf of one: the API's
middleware sets it per HTTP call (the caller's ``X-Request-ID``, or a new one, sent
back in the answer), a delivery worker sets it to the campaign request whose run it
executes. It lives in a context variable, so the tasks and threads a call starts
inherit it.

No personal data in lines: push tokens and user ids are never logged in clear;
:func:`fingerprint` gives a short, stable stand-in when a line needs to tell two
apart.
"""

from __future__ import annotations

import hashlib
import json
import logging
import logging.config
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final, Literal

LogFormat = Literal["text", "json"]

request_id: Final[ContextVar[str | None]] = ContextVar("campaign_trigger_request_id", default=None)
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"


def fingerprint(value: str) -> str:
    """A short stand-in of a token or user id for a log line: not reversible, stable."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]


_DEVICE_PATH: Final = re.compile(r"(/3/device/)([^/?]+)")


def without_tokens(path: str) -> str:
    """A URL path with the device token of an APNs path (``/3/device/<token>``) replaced
    by its :func:`fingerprint`."""
    return _DEVICE_PATH.sub(lambda m: f"{m.group(1)}<token {fingerprint(m.group(2))}>", path)


@contextmanager
def about_request(identifier: str | None) -> Iterator[None]:
    """Lines written inside carry ``request_id=identifier``."""
    token = request_id.set(identifier)
    try:
        yield
    finally:
        request_id.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, error."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": request_id.get(),
        }
        flow_run = getattr(record, "flow_run_id", None)  # Prefect's run loggers add it
        if flow_run:
            line["flow_run_id"] = str(flow_run)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        current = request_id.get()
        return f"{text} [request_id={current}]" if current else text


def formatter(kind: LogFormat) -> logging.Formatter:
    return JsonFormatter() if kind == "json" else _TextFormatter(TEXT_FORMAT)


def dict_config(kind: LogFormat, *, level: str = "INFO") -> dict[str, Any]:
    """A :func:`logging.config.dictConfig` writing our, Prefect's and uvicorn's lines to
    stderr in ``kind``, the request id on each (uvicorn takes it as ``log_config``).

    Prefect's run loggers keep their own handler (run logs sent to the Prefect UI) and
    reach this one through ``prefect``.
    """
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"chosen": {"()": formatter, "kind": kind}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "chosen",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "campaign_trigger": {"handlers": ["stderr"], "level": level, "propagate": False},
            "prefect": {"handlers": ["stderr"], "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["stderr"], "level": level, "propagate": False},
        },
    }


def configure(kind: LogFormat) -> None:
    """Set this process's logging up as :func:`dict_config` says (after Prefect's own).

    ``dictConfig`` strips the handlers of every existing logger below one it configures:
    Prefect's ``prefect.flow_runs`` and ``prefect.task_runs`` would lose the handler that
    sends the run logs to the Prefect UI. Prefect's loggers keep what they had.
    """
    kept = {
        logger: (list(logger.handlers), logger.level, logger.propagate)
        for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("prefect.") and isinstance(logger, logging.Logger) and logger.handlers
    }
    logging.config.dictConfig(dict_config(kind))
    for logger, (handlers, level, propagate) in kept.items():
        logger.handlers, logger.level, logger.propagate = handlers, level, propagate
