"""What an attempt leaves behind: its output encoded once as JSON text, or its error cut short.

``encode_output`` is the only place a handler's return value becomes stored text; the
completion (``types.SuccessRequest.output_json``) carries that text as it is.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.conf import settings

from engine import secret_refs
from engine.attempt_log import cap_middle, own_traceback
from engine.handlers import PermanentTaskError
from engine.secret_refs import REDACTED
from flowforge.jsonb import stored_bytes, strip_nul

# Characters of a failed attempt's error kept (the task run's ``error`` and its event's
# detail): a handler's exception message is unbounded, and every run detail, event page
# and event stream would carry it once per attempt.
MAX_ERROR_CHARS = 4000


def error_text(exc: BaseException, *, redaction: re.Pattern[str] | None = None) -> str:
    """``"<ExceptionType>: <message>"``, cut to MAX_ERROR_CHARS characters (an ellipsis and
    how many characters were dropped mark a cut). With ``redaction``
    (``engine.secret_refs.redaction_pattern`` of the secret values the attempt used), each
    match is replaced by ``[redacted]`` first, so a cut never leaves part of a value."""
    text = f"{type(exc).__name__}: {exc}"
    if redaction is not None:
        text = redaction.sub(REDACTED, text)
    if len(text) <= MAX_ERROR_CHARS:
        return text
    note = f"… ({len(text) - MAX_ERROR_CHARS + 60} more characters cut)"
    return text[: MAX_ERROR_CHARS - 60] + note


def traceback_text(exc: BaseException, *, values: list[str], redaction: re.Pattern[str] | None,
                   limit: int, skip_frames: int = 1) -> str:
    """The traceback of ``exc`` as Python prints it (its causes and contexts too), keeping
    only the frames of the organization's own code: modules of the registered task
    callables' top-level packages (FLOWFORGE_TASK_CALLABLES), each path relative to its
    sys.path entry (``tests/callables.py``). The platform's frames — the engine, its
    built-in handlers, the standard library and installed libraries — are left out, so no
    server path or platform code reaches a viewer; a failure with no frame of the
    organization's (a built-in handler's: an http task's connection error) is only its
    ``Type: message`` lines. The first ``skip_frames`` frames (the attempt flow's own,
    which caught it) are never kept. Each match of ``redaction`` (the attempt's secret
    ``values`` in their forms) is replaced by ``[redacted]``, then the text is cut to at
    most ``limit`` characters (``cap_middle``)."""
    text = own_traceback(exc, skip_frames=skip_frames)
    text = secret_refs.redact_text(text, redaction)
    return cap_middle(text, limit=limit, values=values, what="the traceback",
                      setting="FLOWFORGE_TASK_TRACEBACK_MAX_CHARS")


class OutputTooLarge(PermanentTaskError):
    """A handler returned more than FLOWFORGE_MAX_OUTPUT_BYTES of output."""


class OutputNotJson(PermanentTaskError):
    """A handler returned a value JSON cannot encode."""


def encode_output(output: Any, *, limit_bytes: int | None = None,
                  setting: str = "FLOWFORGE_MAX_OUTPUT_BYTES") -> str:
    """``output`` (NULs stripped) as the JSON text to store, when it fits ``limit_bytes``
    (bytes of UTF-8 JSON as stored, ``flowforge.jsonb.stored_bytes``; default FLOWFORGE_MAX_OUTPUT_BYTES, the largest output kept in the
    task-run row; the attempt flow passes FLOWFORGE_MAX_OFFLOADED_OUTPUT_BYTES and offloads
    what is over the row's cap: ``engine.offload``).

    Raises OutputTooLarge (naming both sizes and ``setting``) rather than storing a truncated
    value that dependents would misread, and OutputNotJson for a value JSON cannot encode
    (NaN and Infinity included); both fail the task without retries, since another
    attempt returns the same. The text goes to the completion as it is, so an output is
    encoded once (``types.SuccessRequest.output_json``).
    """
    limit = settings.FLOWFORGE_MAX_OUTPUT_BYTES if limit_bytes is None else limit_bytes
    try:
        encoded = json.dumps(strip_nul(output), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise OutputNotJson(f"task output is not JSON-encodable: {exc}") from exc
    size = stored_bytes(encoded)  # as stored: a number with an exponent comes back in full
    if size > limit:
        raise OutputTooLarge(
            f"task output is {size} bytes of JSON, over {setting} ({limit}); return a summary or a reference instead"
        )
    return encoded


def cap_output(output: Any) -> Any:
    """``output`` as it will be stored: ``encode_output(output)`` decoded again (NULs
    stripped, keys made strings). Raises what ``encode_output`` raises."""
    return json.loads(encode_output(output))
