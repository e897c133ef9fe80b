"""Transaction helpers for the engine's hot paths."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from django.db import (
    DatabaseError,
    InterfaceError,
    NotSupportedError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)

log = logging.getLogger(__name__)

# SQLSTATEs that mean "try the same transaction again": serialization_failure, deadlock_detected.
RETRYABLE_SQLSTATES = {"40001", "40P01"}
# feature_not_supported: what a prepared statement raises after its table changed shape.
STALE_PLAN_SQLSTATE = "0A000"


def _sqlstate(exc: BaseException) -> str | None:
    cause = exc.__cause__ or exc.__context__
    return getattr(cause, "sqlstate", None) or getattr(exc, "sqlstate", None)


def retry_transient[T](fn: Callable[[], T], *, atomic: bool, attempts: int = 5, connection_attempts: int = 0,
                       base_delay_seconds: float = 0.05) -> T:
    """Run ``fn`` (inside ``transaction.atomic`` when ``atomic``) and return its result,
    running it again on a deadlock or serialization failure (up to ``attempts`` times)
    and, when ``connection_attempts`` > 0, on a lost database connection (a PostgreSQL
    restart) with exponential backoff capped at 2 seconds. Re-raises the last error
    when the retries are spent.

    Only safe for ``fn`` whose effects are all inside its transaction(s), so that a
    repetition is correct.
    """
    tries = 0
    conn_tries = 0
    while True:
        try:
            if atomic:
                with transaction.atomic():
                    return fn()
            return fn()
        except OperationalError as exc:
            state = _sqlstate(exc)
            if state in RETRYABLE_SQLSTATES and tries < attempts:
                tries += 1
                time.sleep(random.uniform(0, base_delay_seconds * tries))
                continue
            if state not in RETRYABLE_SQLSTATES and conn_tries < connection_attempts:
                conn_tries += 1
                _reset_connection()
                time.sleep(min(2.0, base_delay_seconds * 2**conn_tries))
                continue
            raise
        except NotSupportedError as exc:
            if _sqlstate(exc) == STALE_PLAN_SQLSTATE and tries < attempts:
                # A migration changed a table under this connection's prepared statements
                # ("cached plan must not change result type"): a new connection re-prepares.
                tries += 1
                _reset_connection()
                continue
            raise
        except InterfaceError:
            if conn_tries < connection_attempts:
                conn_tries += 1
                _reset_connection()
                time.sleep(min(2.0, base_delay_seconds * 2**conn_tries))
                continue
            raise


def atomic_retry[T](fn: Callable[[], T], *, attempts: int = 5, connection_attempts: int = 0,
                    base_delay_seconds: float = 0.05) -> T:
    """``retry_transient`` of ``fn`` in ``transaction.atomic``: the whole transaction is
    retried on a deadlock, a serialization failure or (when asked) a lost connection."""
    return retry_transient(fn, atomic=True, attempts=attempts, connection_attempts=connection_attempts,
                           base_delay_seconds=base_delay_seconds)


def _reset_connection() -> None:
    try:
        connection.close()
    except DatabaseError:
        log.debug("closing a broken connection failed", exc_info=True)
    close_old_connections()
