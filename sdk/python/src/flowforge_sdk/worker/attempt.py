"""One attempt, in its own thread: run the handler, then report its result.

The outcome of the handler:

- it returned a JSON value → ``complete`` with it;
- it raised NonRetryableError → ``fail`` with ``retryable: false``;
- it raised anything else → ``fail`` with ``retryable: true`` (the server retries while
  attempts are left);
- either way the handler's traceback goes with the ``fail`` (the server keeps it beside
  the error: the run page's task panel and the API's task detail show it);
- no handler has the task's name, or the output is not JSON → ``fail``, not retryable;
- the server took the task back meanwhile (``ctx.cancelled``) → nothing is sent.

Reporting outlives an outage: the call is tried again with backoff (and at least the
``Retry-After`` of a 429 or 5xx) while the server cannot be reached or answers 5xx, until it
answers. A 409 ends it — the result was refused, or an earlier try that got no answer
had landed — as does a 404, a refused key, or the worker giving up at the end of its
drain. Log lines still buffered are sent first: after the result the token is stale.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flowforge_sdk._http import dumps
from flowforge_sdk.backoff import Backoff
from flowforge_sdk.client import MAX_ERROR_CHARS, WorkerAPI
from flowforge_sdk.errors import (
    ApiError,
    AuthenticationError,
    Conflict,
    NetworkError,
    NonRetryableError,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServerError,
    TaskCancelled,
    ValidationError,
)
from flowforge_sdk.worker.context import TaskContext
from flowforge_sdk.worker.held import HeldTask

logger = logging.getLogger("flowforge_sdk.worker")

Handler = Callable[[TaskContext], Any]


@dataclass(frozen=True)
class Complete:
    output: Any


@dataclass(frozen=True)
class Fail:
    error: str
    retryable: bool
    traceback: str = ""


Outcome = Complete | Fail


def error_text(exc: BaseException) -> str:
    """``ValueError: image too large``, cut to the protocol's 10,000 characters."""
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def run_handler(held: HeldTask, handler: Handler | None, *, known: list[str]) -> Outcome | None:
    """Call the handler and turn what it did into an Outcome (None: nothing to report,
    the task was taken back). Never raises."""
    ctx = held.ctx
    if handler is None:
        names = ", ".join(sorted(known)) or "none"
        return Fail(f"no handler named {held.task.name!r} in this worker (queue {held.task.queue!r}; "
                    f"its handlers: {names}); register one with @worker.task({held.task.name!r})", retryable=False)
    try:
        output = handler(ctx)
    except TaskCancelled:
        return None
    except NonRetryableError as exc:
        if ctx.cancelled:
            return None
        return Fail(error_text(exc), retryable=False, traceback=traceback_text(exc))
    except BaseException as exc:  # noqa: B036 (a handler's SystemExit fails its attempt, not the worker)
        if ctx.cancelled:
            return None
        logger.warning("task %s: the handler raised %s", held.describe(), type(exc).__name__)
        return Fail(error_text(exc), retryable=True, traceback=traceback_text(exc))
    if ctx.cancelled:
        return None
    try:
        dumps(output)
    except (TypeError, ValueError) as exc:
        return Fail(f"the handler's output is not JSON ({type(output).__name__}): {exc}"[:MAX_ERROR_CHARS],
                    retryable=False)
    return Complete(output)


def traceback_text(exc: BaseException) -> str:
    """The handler's traceback as Python prints it, from the handler's own frame on (this
    module's frame, which called it, left out)."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def report(held: HeldTask, outcome: Outcome, *, api: WorkerAPI, backoff: Backoff, give_up: threading.Event) -> bool:
    """Send the buffered log lines, then ``outcome``, trying again until the server
    answers (see the module's docstring). Returns True when the server recorded it."""
    ctx = held.ctx
    retries = backoff.copy()
    refused_output = False
    while True:
        if ctx.cancelled:
            logger.warning("task %s: result dropped, the server took the task back (%s)", held.describe(),
                           ctx.cancel_reason)
            return False
        try:
            held.logs.flush(api)
            if isinstance(outcome, Complete):
                api.complete(held.task_run_id, held.task.fencing_token, outcome.output)
                logger.info("task %s: completed", held.describe())
            else:
                result = api.fail(held.task_run_id, held.task.fencing_token, outcome.error,
                                  retryable=outcome.retryable, traceback=outcome.traceback)
                logger.info("task %s: failed (%s, retryable=%s) -> %s", held.describe(), outcome.error[:200],
                            outcome.retryable, result.state)
            return True
        except Conflict as exc:
            ctx._mark_lost(exc.code or "conflict")
            logger.warning("task %s: the server refused the result (%s: %s)%s", held.describe(), exc.code,
                           exc.detail, " — or recorded an earlier try of it" if retries.failures else "")
            return False
        except NotFound as exc:
            logger.warning("task %s: the server no longer knows it (%s); result dropped", held.describe(), exc)
            return False
        except (ValidationError, PayloadTooLarge) as exc:
            if isinstance(outcome, Complete) and not refused_output:
                # Fail the attempt for good rather than leave it to its lease: a retry would
                # produce the same refused output.
                refused_output = True
                outcome = Fail(f"the server refused the handler's output: {exc.detail} {exc.errors or ''}".strip()
                               [:MAX_ERROR_CHARS], retryable=False)
                logger.error("task %s: output refused (%s); reporting the attempt as failed", held.describe(), exc)
                continue
            logger.error("task %s: the server refused the report (%s); result dropped", held.describe(), exc)
            return False
        except (AuthenticationError, PermissionDenied) as exc:
            logger.error("task %s: cannot report, the key was refused (%s); result dropped", held.describe(), exc)
            return False
        except (RateLimited, ServerError) as exc:
            delay = retries.next_delay(retry_after=exc.retry_after)
            reason = str(exc)
        except NetworkError as exc:
            delay = retries.next_delay()
            reason = str(exc)
        except ApiError as exc:
            logger.error("task %s: the server refused the report (%s); result dropped", held.describe(), exc)
            return False
        except Exception as exc:  # a bug: keep the result and try again rather than lose it
            logger.exception("task %s: unexpected error while reporting", held.describe())
            delay = retries.next_delay()
            reason = repr(exc)
        logger.warning("task %s: could not report the result (%s); trying again in %.1f s", held.describe(), reason,
                       delay)
        if give_up.wait(delay):
            logger.error("task %s: the worker stopped before the result could be reported; its lease will run out "
                         "and the server will hand it out again", held.describe())
            return False
