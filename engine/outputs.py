"""Task outputs in run details: inline when small, a summary with a link when large.

A task's output may be up to FLOWFORGE_MAX_OUTPUT_BYTES (256 KiB) and a run may have
thousands of task runs, so a run's detail (API and web) never loads every output:
``with_output_sizes`` defers the ``output`` column and selects, in SQL, the size of
each output's JSON text and the output itself only where that size is at most
FLOWFORGE_INLINE_OUTPUT_BYTES. ``output_or_summary`` then gives the value to show: the
output, or ``{"truncated": true, "bytes": n, "url": <the whole output>}``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Case, F, Func, IntegerField, JSONField, QuerySet, TextField, Value, When
from django.db.models.functions import Cast

from engine import offload


def inline_output_limit() -> int:
    """FLOWFORGE_INLINE_OUTPUT_BYTES: the largest output (bytes of JSON text) shown inline."""
    return int(getattr(settings, "FLOWFORGE_INLINE_OUTPUT_BYTES", 4 * 1024))


def output_bytes_expression() -> Func:
    """SQL: the size in bytes of a task run's output as JSON text (NULL for no output)."""
    return Func(Cast(F("output"), TextField()), function="octet_length", output_field=IntegerField())


def with_output_sizes(queryset: QuerySet) -> QuerySet:
    """``queryset`` of TaskRuns without the ``output`` column, annotated with
    ``output_bytes`` (int | None) and ``output_inline`` (the output when it is at most
    ``inline_output_limit()`` bytes, else None). Adds no query."""
    limit = inline_output_limit()
    return queryset.defer("output").annotate(
        output_bytes=output_bytes_expression(),
        output_inline=Case(
            When(output_bytes__lte=limit, then=F("output")),
            default=Value(None, output_field=JSONField()),
            output_field=JSONField(),
        ),
    )


def is_summarized(task_run: Any) -> bool:
    """Whether ``task_run`` (from ``with_output_sizes``) has an output too large to show
    inline: over the inline limit, or kept in the offload storage (``engine.offload``)."""
    size = getattr(task_run, "output_bytes", None)
    return (size is not None and size > inline_output_limit()) or offload.is_ref(getattr(task_run, "output_inline", None))


def output_or_summary(task_run: Any, *, url: str) -> Any:
    """The output to show for ``task_run`` (from ``with_output_sizes``): the output
    itself when small, else ``{"truncated": True, "bytes": <bytes of its JSON text>,
    "url": url}`` where ``url`` returns the whole output (for an offloaded output, the
    bytes are the whole output's, from its summary)."""
    inline = getattr(task_run, "output_inline", None)
    if offload.is_ref(inline):
        return {"truncated": True, "bytes": inline["bytes"], "url": url}
    if is_summarized(task_run):
        return {"truncated": True, "bytes": task_run.output_bytes, "url": url}
    return inline
