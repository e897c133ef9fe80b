"""Task callables of the test suite, registered in tests/settings.py only (never in a
deployment's FLOWFORGE_TASK_CALLABLES)."""

from __future__ import annotations


def echo(input, upstream, factor=1, context=None):
    """Return what a python task receives: the run input, the upstream outputs, the
    ``factor`` param and the attempt number (from the injected TaskContext)."""
    return {"input": input, "upstream": upstream, "factor": factor, "attempt": context.attempt}


def log_print_raise(input, upstream, secret="", context=None):
    """Log a line (naming ``secret``, a secret's value when the config references one),
    print one to stdout and one to stderr, then raise ValueError from two calls down: a
    failure whose lines and full traceback the attempt keeps (issue 19)."""
    import logging
    import sys

    logging.getLogger("tests.callables").warning("connecting with token %s", secret)
    print(f"attempt {context.attempt if context else '?'} printed this")
    print("to stderr", file=sys.stderr)
    _outer_step(input.get("rows", 3))


def _outer_step(rows):
    return _inner_step(rows)


def _inner_step(rows):
    raise ValueError(f"no rows left after {rows} tries")


def chatty(input, upstream, lines=10, width=20, context=None):
    """Print ``lines`` lines of ``width`` characters each, then succeed with how many."""
    for i in range(lines):
        print(f"{i:06d} " + "x" * max(0, width - 7))
    return {"printed": lines}


def slow_logger(input, upstream, seconds=2.0, every=0.1, context=None):
    """Log a numbered line every ``every`` seconds for ``seconds`` seconds (lines written
    while the attempt still runs), then succeed."""
    import logging
    import time

    log = logging.getLogger("tests.callables.slow")
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        n += 1
        log.info("tick %d", n)
        time.sleep(every)
    return {"ticks": n}


def schedule_of(input, upstream, context=None):
    """Return the cron instant and data interval the run is for, as the handler's context
    holds it (``TaskContext.schedule``: ISO 8601 strings in UTC), or None for a run that
    has none."""
    return context.schedule.as_dict() if context.schedule is not None else None


def big_output(input, upstream, size=2 * 1024 * 1024, context=None):
    """An output of ``size`` characters of payload (tests/integration/test_offload.py: over
    the task-run row's cap, so it is offloaded)."""
    return {"size": size, "blob": "x" * size}


def print_key(input, upstream, key="", context=None):
    """Print ``key`` (a multi-line secret's value, from the params) whole, then line by
    line, then in 7-character pieces written without newlines of their own: each line of
    it must be redacted from the attempt's log (issue 19's review)."""
    import sys

    print(key)
    for line in key.splitlines():
        print(line)
    for i in range(0, len(key), 7):
        sys.stdout.write(key[i:i + 7])
    sys.stdout.write("\n")
    print("done")
    return {"printed": len(key.splitlines())}
