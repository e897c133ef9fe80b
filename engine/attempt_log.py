"""What one attempt says while its handler runs on a shared worker (issue 19): its lines.

A worker thread runs one attempt at a time, and a worker process runs many threads, so
nothing here redirects a process-wide stream: the attempt's ``AttemptLog`` is the value of
a context variable (``capturing``) for as long as its handler runs, and two process-wide
hooks, installed once (``install``) and idle outside an attempt, hand each line to the
``AttemptLog`` of the context it was written in:

- ``CaptureHandler``, a ``logging.Handler`` on the root logger: every record the handler's
  code emits (at the logger's effective level; the root logger's is INFO unless LOG_LEVEL
  says otherwise), as ``<logger name>: <message>`` with its exception's traceback, if any.
  Records of the platform's own loggers (``PLATFORM_LOGGERS``) are the operator's and stay
  out; they still reach the worker's own log as before.
- ``StreamProxy`` in place of ``sys.stdout`` and ``sys.stderr``: inside an attempt, what is
  written becomes that attempt's ``stdout`` / ``stderr`` lines (a partial line waits for its
  end, or for the attempt's); outside one, it goes to the stream it replaced. Handlers that
  configured logging before (the worker's console handler) hold the original streams, so a
  record is never captured twice.

Threads a handler starts itself do not inherit the context: what they print or log goes
to the worker's own output, as before. ``note`` adds a line directly (the http task's
request summary).

Every line is redacted of the attempt's secret values (``engine.secret_refs``) and cut to
MAX_LINE_CHARS before it is kept; an attempt keeps at most FLOWFORGE_TASK_LOG_MAX_LINES
lines and FLOWFORGE_TASK_LOG_MAX_BYTES bytes of messages (UTF-8), after which one
``system`` line says the log was truncated, later lines are counted and dropped, and a last
``system`` line at the end says how many. Nothing here touches the database: lines wait in
the ``AttemptLog`` until ``engine.worker.log_shipper`` takes them (``take``), so an attempt
that logs nothing costs no statement.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import linecache
import logging
import os
import re
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from engine import secret_refs
from engine.handlers import callables

#: Characters kept of one line; a longer one is cut, and says so.
MAX_LINE_CHARS = 8000
#: Logger name prefixes whose records are the platform's, never an attempt's lines: the
#: engine's own, Dramatiq's, Django's, and httpx/httpcore's (the http task type writes its
#: own request summary; their "HTTP Request:" lines would repeat it).
PLATFORM_LOGGERS = ("engine", "flowforge", "dramatiq", "django", "httpx", "httpcore")

_current: contextvars.ContextVar[AttemptLog | None] = contextvars.ContextVar("flowforge_attempt_log", default=None)


def _level_name(levelno: int) -> str:
    """A logging level number as a core_tasklog level (CRITICAL is ``error``)."""
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    if levelno >= logging.INFO:
        return "info"
    return "debug"


def _human_bytes(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KiB"


class Line:
    """One captured line: where it came from, its level, its (redacted, cut) message and
    when it was written (UTC)."""

    __slots__ = ("stream", "level", "message", "at")

    def __init__(self, stream: str, level: str, message: str, at: dt.datetime):
        self.stream, self.level, self.message, self.at = stream, level, message, at

    def __repr__(self) -> str:
        return f"Line({self.stream!r}, {self.level!r}, {self.message!r})"


class AttemptLog:
    """The lines of one attempt (one generation of one task run), waiting to be written.

    ``add`` keeps a line (redacted, cut, within the caps: see the module docstring);
    ``write`` takes text written to stdout or stderr; ``close`` ends the partial lines and
    adds the final truncation count; ``take`` hands the lines not yet taken to the writer.
    Thread-safe: the handler's thread adds while the shipper's thread takes.
    ``on_first_line``, when set, is called once, by the thread that adds the first line
    (the shipper registers the log then, so a silent attempt is never registered).
    """

    def __init__(self, *, organization_id: uuid.UUID, workflow_run_id: uuid.UUID, task_run_id: uuid.UUID,
                 attempt: int, fencing_token: int, max_lines: int, max_bytes: int,
                 on_first_line: Callable[[AttemptLog], None] | None = None):
        self.organization_id = organization_id
        self.workflow_run_id = workflow_run_id
        self.task_run_id = task_run_id
        self.attempt = attempt
        self.fencing_token = fencing_token
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.on_first_line = on_first_line
        self.kept_lines = 0
        self.kept_bytes = 0
        self.dropped_lines = 0
        self.dropped_bytes = 0
        self.truncated = False
        self.closed = False
        self._values: tuple[str, ...] = ()
        self._pattern: re.Pattern[str] | None = None
        self._pending: list[Line] = []
        self._partial: dict[str, list[str]] = {}
        self._started = False
        self._lock = threading.Lock()
        #: Held by whoever writes this log's lines, so they reach the table in order.
        self.write_lock = threading.Lock()

    def redact_with(self, values: list[str], pattern: re.Pattern[str] | None) -> None:
        """Redact the secret ``values`` (and their encoded forms: ``pattern``, from
        ``secret_refs.redaction_pattern``) from every line added from now on."""
        self._values, self._pattern = tuple(values), pattern

    def _redacted(self, message: str) -> str:
        """``message`` redacted, and cut to MAX_LINE_CHARS (redacted before the cut, and what
        a cut through a value left at the end redacted too)."""
        message = secret_refs.redact_text(message, self._pattern)
        if len(message) > MAX_LINE_CHARS:
            cut = message[:MAX_LINE_CHARS]
            if self._values:
                cut = secret_refs.redact_tail(cut, self._values)
            message = f"{cut}… ({len(message) - MAX_LINE_CHARS} more characters cut)"
        return message

    def add(self, stream: str, level: str, message: str) -> None:
        """Keep one line (``stream``: a core_tasklog stream; ``level``: debug, info, warning
        or error), unless the attempt's log is full or closed: then it is only counted."""
        message = self._redacted(message)
        size = len(message.encode("utf-8", "replace"))
        first = False
        with self._lock:
            if self.closed:
                return
            if self.truncated or self.kept_lines + 1 > self.max_lines or self.kept_bytes + size > self.max_bytes:
                if not self.truncated:
                    self.truncated = True
                    self._pending.append(Line("system", "warning", self._truncation_note(size), _now()))
                self.dropped_lines += 1
                self.dropped_bytes += size
                return
            self.kept_lines += 1
            self.kept_bytes += size
            self._pending.append(Line(stream, level, message, _now()))
            if not self._started:
                self._started = first = True
        if first and self.on_first_line is not None:
            self.on_first_line(self)

    def _truncation_note(self, size: int) -> str:
        if self.kept_lines + 1 > self.max_lines:
            limit = f"its limit of {self.max_lines} lines (FLOWFORGE_TASK_LOG_MAX_LINES)"
        else:
            limit = f"its limit of {_human_bytes(self.max_bytes)} (FLOWFORGE_TASK_LOG_MAX_BYTES)"
        return f"log truncated: this attempt's log reached {limit}; later lines are dropped"

    def write(self, stream: str, text: str) -> None:
        """Text written to ``stream`` (stdout or stderr): each complete line becomes a line
        (level info for stdout, warning for stderr); the rest waits for its end."""
        if not text:
            return
        level = "warning" if stream == "stderr" else "info"
        with self._lock:
            parts = self._partial.setdefault(stream, [])
            if "\n" not in text:
                # A line that grows past the cut is cut here too: nothing waits unbounded.
                if sum(len(p) for p in parts) <= MAX_LINE_CHARS:
                    parts.append(text)
                return
            *complete, rest = text.split("\n")
            head = "".join(parts) + complete[0]
            parts.clear()
            if rest:
                parts.append(rest)
        for line in (head, *complete[1:]):
            self.add(stream, level, line.rstrip("\r"))

    def close(self) -> None:
        """End of the attempt: its partial lines are added, then (when lines were dropped) a
        last ``system`` line counting them; nothing is added after."""
        with self._lock:
            partial = [(stream, "".join(parts)) for stream, parts in self._partial.items() if parts]
            self._partial.clear()
        for stream, text in partial:
            self.add(stream, "warning" if stream == "stderr" else "info", text)
        with self._lock:
            if self.dropped_lines:
                self._pending.append(Line("system", "warning", (
                    f"log truncated: {self.dropped_lines} more line{'s' if self.dropped_lines != 1 else ''} "
                    f"({_human_bytes(self.dropped_bytes)}) of this attempt were dropped"), _now()))
            self.closed = True

    def take(self) -> list[Line]:
        """The lines added since the last ``take``, oldest first (the caller writes them)."""
        with self._lock:
            lines, self._pending = self._pending, []
        return lines

    @property
    def has_lines(self) -> bool:
        """Whether any line was ever added (a silent attempt has nothing to write)."""
        return self._started or bool(self._pending)


def cap_middle(text: str, *, limit: int, values: list[str], what: str, setting: str) -> str:
    """``text`` (already redacted) when it has at most ``limit`` characters; else its first
    whole lines (a quarter of ``limit``) and its last whole lines (the rest), with a line
    between them saying how many characters of ``what`` were cut and which ``setting``
    caps it. A last line longer than its share keeps its start, with what the cut left of a
    secret value at its end redacted (``secret_refs.redact_tail``)."""
    if len(text) <= limit:
        return text
    note_room = 120
    head_room = max(0, (limit - note_room) // 4)
    tail_room = max(1, limit - note_room - head_room)
    lines = text.splitlines(keepends=True)
    head: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) > head_room:
            break
        head.append(line)
        used += len(line)
    tail: list[str] = []
    kept = 0
    for line in reversed(lines[len(head):]):
        if kept + len(line) > tail_room:
            break
        tail.append(line)
        kept += len(line)
    tail.reverse()
    if not tail:  # one last line longer than the room: its start
        start = secret_refs.redact_tail(lines[-1][:tail_room], values) if values else lines[-1][:tail_room]
        tail, kept = [start + "…\n"], tail_room
    cut = len(text) - used - kept
    return "".join(head) + f"… {cut} characters of {what} cut ({setting}) …\n" + "".join(tail)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def current() -> AttemptLog | None:
    """The AttemptLog of the attempt running in this context, or None."""
    return _current.get()


def note(stream: str, level: str, message: str) -> None:
    """Add a line to the attempt running in this context (nothing outside one)."""
    log = _current.get()
    if log is not None:
        log.add(stream, level, message)


@contextlib.contextmanager
def capturing(log: AttemptLog) -> Iterator[AttemptLog]:
    """Inside the block, this context's logging records and stdout/stderr text are
    ``log``'s lines (the hooks are installed first if they are not). Reset in a ``finally``."""
    install()
    token = _current.set(log)
    try:
        yield log
    finally:
        _current.reset(token)


class CaptureHandler(logging.Handler):
    """The root logger's handler that hands a record to the AttemptLog of the context it
    was emitted in (none: ignored). No lock: ``AttemptLog.add`` is thread-safe."""

    def handle(self, record: logging.LogRecord) -> bool:
        log = _current.get()
        if log is None or record.name.startswith(PLATFORM_LOGGERS):
            return False
        self.emit(record, log)
        return True

    def emit(self, record: logging.LogRecord, log: AttemptLog | None = None) -> None:  # type: ignore[override]
        log = log or _current.get()
        if log is None:
            return
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: its template, as logging would
            message = str(record.msg)
        # The exception's frames as a stored traceback keeps them (own_traceback: no
        # platform frame nor server path); the record itself is left as it is for the
        # process's own log.
        if record.exc_info and record.exc_info[1] is not None:
            message = f"{message}\n{own_traceback(record.exc_info[1]).rstrip()}"
        elif record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{record.stack_info}"
        if record.name != "root":
            message = f"{record.name}: {message}"
        log.add("logging", _level_name(record.levelno), message)


# Top-level packages of the platform itself: their frames are never the organization's
# code, even if a deployment registered a callable under one of them.
_PLATFORM_PACKAGES = frozenset({"engine", "flowforge", "tenancy", "api", "audit", "frontend", "django", "dramatiq",
                                "httpx", "httpcore", "celpy"})


def _own_packages() -> frozenset[str]:
    """Top-level packages of the registered task callables (FLOWFORGE_TASK_CALLABLES): the
    organization's own code, as the operator installed it."""
    return frozenset(name.split(".", 1)[0] for name in callables.registered_names()) - _PLATFORM_PACKAGES


def _relative(filename: str) -> str:
    """``filename`` relative to the longest sys.path entry holding it (``shop/tasks.py``),
    else its last part: no server path is shown."""
    path = os.path.abspath(filename)
    best = ""
    for entry in sys.path:
        root = os.path.abspath(entry or os.curdir) + os.sep
        if path.startswith(root) and len(root) > len(best):
            best = root
    return path[len(best):] if best else os.path.basename(path)


def _own_stack(tb, own: frozenset[str], skip: int) -> traceback.StackSummary:
    """The frames of ``tb`` (after its first ``skip``) whose module belongs to ``own``
    packages, with relative paths."""
    kept = []
    for index, (frame, lineno) in enumerate(traceback.walk_tb(tb)):
        if index < skip:
            continue
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".", 1)[0] not in own:
            continue
        filename = frame.f_code.co_filename
        kept.append(traceback.FrameSummary(_relative(filename), lineno, frame.f_code.co_name, lookup_line=False,
                                           line=linecache.getline(filename, lineno).strip()))
    return traceback.StackSummary.from_list(kept)


def _keep_own_frames(te: traceback.TracebackException, exc: BaseException | None, own: frozenset[str],
                     skip: int, seen: set[int]) -> None:
    """``te`` (and its causes, contexts and group members, walked beside their exceptions)
    with only the organization's frames left (``_own_stack``)."""
    if exc is None or id(te) in seen:
        return
    seen.add(id(te))
    te.stack = _own_stack(exc.__traceback__, own, skip)
    if te.__cause__ is not None:
        _keep_own_frames(te.__cause__, exc.__cause__, own, 0, seen)
    if te.__context__ is not None:
        _keep_own_frames(te.__context__, exc.__context__, own, 0, seen)
    for member_te, member in zip(te.exceptions or [], getattr(exc, "exceptions", None) or [], strict=False):
        _keep_own_frames(member_te, member, own, 0, seen)


def own_traceback(exc: BaseException, *, skip_frames: int = 0) -> str:
    """``exc``'s traceback as Python prints it (causes, contexts and group members too),
    with only the frames of the organization's own code: modules of the registered task
    callables' top-level packages (FLOWFORGE_TASK_CALLABLES), each path relative to its
    sys.path entry. The platform's frames (the engine, its built-in handlers, the standard
    library, installed libraries) are left out, so no server path reaches a viewer; an
    exception with no frame of the organization's is only its ``Type: message`` line. The
    first ``skip_frames`` frames of ``exc`` itself are never kept. Not redacted."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    _keep_own_frames(te, exc, _own_packages(), skip_frames, set())
    return "".join(te.format())


class StreamProxy:
    """Stands for ``sys.stdout`` or ``sys.stderr``: inside an attempt, text written is the
    attempt's ``stream`` lines; outside one, it goes to the stream it replaced, and every
    other attribute (``fileno``, ``encoding``, ``buffer``...) is that stream's."""

    def __init__(self, stream: str, original: TextIO):
        self._stream = stream
        self._original = original

    @property
    def original(self) -> TextIO:
        return self._original

    def write(self, text: str) -> int:  # type: ignore[override]
        log = _current.get()
        if log is None:
            return self._original.write(text)
        log.write(self._stream, text)
        return len(text)

    def writelines(self, lines: Any) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if _current.get() is None:
            self._original.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False if _current.get() is not None else self._original.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


_HANDLER = CaptureHandler()
_install_lock = threading.Lock()


def install() -> None:
    """Put the hooks in place: ``CaptureHandler`` on the root logger and ``StreamProxy`` as
    ``sys.stdout``/``sys.stderr``, each unless it already is (a logging configuration
    or a test's output capture may have replaced them since). Cheap when in place."""
    root = logging.getLogger()
    if (_HANDLER in root.handlers and isinstance(sys.stdout, StreamProxy)
            and isinstance(sys.stderr, StreamProxy)):
        return
    with _install_lock:
        if _HANDLER not in root.handlers:
            root.addHandler(_HANDLER)
        if not isinstance(sys.stdout, StreamProxy):
            sys.stdout = StreamProxy("stdout", sys.stdout)
        if not isinstance(sys.stderr, StreamProxy):
            sys.stderr = StreamProxy("stderr", sys.stderr)
