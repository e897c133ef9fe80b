"""The run page's timeline: a Gantt chart of every attempt of every task, as SVG geometry.

Attempts come from the run's events (``attempts_from_events``); positions are
precomputed SVG attributes (x/width), since inline styles are forbidden by the CSP.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence

from django.utils import timezone

from engine.models import WorkflowRun
from engine.trigger_rules import skip_reason_label, skip_reason_text
from frontend.presenters.text import compact_json, human_duration, seconds_between

# Event kinds that open and close one attempt of a task run, for the timeline.
ATTEMPT_START_KINDS = ("started",)
# A "skipped" event ends an attempt when the task's condition was false after its start (its
# worker evaluates it before the handler); one of a task that never started closes nothing.
ATTEMPT_END_KINDS = ("succeeded", "attempt_failed", "attempt_timed_out", "lease_expired", "cancelled", "skipped")
TIMELINE_KINDS = ATTEMPT_START_KINDS + ATTEMPT_END_KINDS


@dataclasses.dataclass
class Attempt:
    """One attempt of one task run, from its ``started`` event to the event that ended it."""

    number: int | None
    start: dt.datetime
    end: dt.datetime | None = None
    outcome: str = "running"  # running, succeeded, failed, retried, timed_out, lease_expired, cancelled, skipped
    error: str = ""
    # SVG coordinates on the timeline (set by Timeline).
    x: float = 0.0
    width: float = 0.0

    @property
    def duration(self) -> str:
        return human_duration(seconds_between(self.start, self.end)) if self.end else "running"

    @property
    def label(self) -> str:
        outcome = self.outcome.replace("_", " ")
        return f"attempt {self.number or '?'}: {outcome}, {self.duration}"


def attempts_from_events(events: Iterable[tuple]) -> dict[uuid.UUID, list[Attempt]]:
    """Attempts per task run from its (task_run_id, kind, created_at, attempt, to_state,
    error text) events in ``seq`` order: a ``started`` opens an attempt, the next end event
    (succeeded, attempt_failed, attempt_timed_out, lease_expired, cancelled, skipped: its
    condition was false) closes it.

    An ``attempt_failed`` that sent the task back to ``ready`` is a ``retried`` attempt;
    one that failed the task is ``failed``. An attempt with no end event yet is
    ``running``.
    """
    out: dict[uuid.UUID, list[Attempt]] = defaultdict(list)
    open_: dict[uuid.UUID, Attempt] = {}
    for task_run_id, kind, created_at, attempt, to_state, error in events:
        if kind in ATTEMPT_START_KINDS:
            current = Attempt(number=attempt, start=created_at)
            open_[task_run_id] = current
            out[task_run_id].append(current)
            continue
        current = open_.pop(task_run_id, None)
        if current is None:
            continue  # e.g. a pending task cancelled before it ever started
        current.end = created_at
        if kind == "succeeded":
            current.outcome = "succeeded"
        elif kind in ("cancelled", "skipped"):
            current.outcome = kind
        else:
            retried = to_state == "ready"
            current.outcome = {
                "attempt_failed": "retried" if retried else "failed",
                "attempt_timed_out": "timed_out",
                "lease_expired": "lease_expired",
            }[kind]
            current.error = compact_json(error or "", limit=200)
    return out


# Timeline geometry, in SVG user units (the SVG scales to its container).
TL_WIDTH = 1000.0
TL_LABEL = 190.0  # left column with the task keys
TL_RIGHT_PAD = 12.0
TL_ROW = 22.0
TL_BAR = 14.0
TL_AXIS = 26.0  # room for the time axis at the top
TL_MIN_BAR = 4.0


@dataclasses.dataclass
class TimelineRow:
    key: str
    y: float
    bar_y: float
    text_y: float
    attempts: list[Attempt]
    state: str


@dataclasses.dataclass
class Timeline:
    """The Gantt chart of every attempt of every task: positions are precomputed
    SVG attributes (x/width), since inline styles are forbidden by the CSP."""

    rows: list[TimelineRow]
    ticks: list[tuple[float, str]]
    height: float
    width: float
    chart_x: float
    chart_end: float
    span_label: str
    has_attempts: bool
    # The chart's origin and, for a finished run, its end, in epoch milliseconds (run-page.js
    # redraws bars and ticks from them as time passes; ``end_ms`` None: it grows with now).
    t0_ms: int = 0
    end_ms: int | None = None


def _nice_step(span: float) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if span / step <= 8:
            return step
    return span / 6


def _tick_label(seconds: float, step: float) -> str:
    if step < 1:
        return f"{seconds:.1f}s"
    if seconds < 60 or step < 60:
        return f"{seconds:.0f}s" if seconds < 60 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m"
    return f"{seconds / 3600:.1f}h".replace(".0h", "h")


def build_timeline(run: WorkflowRun, rows: Sequence[TaskRow], *, now: dt.datetime) -> Timeline:
    t0 = run.started_at or run.created_at
    end = run.finished_at or now
    starts = [a.start for r in rows for a in r.attempts]
    ends = [a.end or now for r in rows for a in r.attempts]
    if starts:
        t0 = min(t0, *starts)
        end = max(end, *ends)
    span = max((end - t0).total_seconds(), 0.5)
    chart_x = TL_LABEL
    chart_w = TL_WIDTH - TL_LABEL - TL_RIGHT_PAD
    scale = chart_w / span
    out_rows = []
    for i, r in enumerate(rows):
        y = TL_AXIS + i * TL_ROW
        for a in r.attempts:
            a.x = round(chart_x + (a.start - t0).total_seconds() * scale, 2)
            # At least TL_MIN_BAR wide, so a 5 ms attempt is still visible and hoverable.
            a.width = round(max(TL_MIN_BAR, ((a.end or now) - a.start).total_seconds() * scale), 2)
            a.x = min(a.x, TL_WIDTH - TL_RIGHT_PAD - TL_MIN_BAR)
        out_rows.append(
            TimelineRow(
                key=r.key,
                y=y,
                bar_y=y + (TL_ROW - TL_BAR) / 2,
                text_y=y + TL_ROW / 2 + 4,
                attempts=r.attempts,
                state=r.state,
            )
        )
    step = _nice_step(span)
    ticks = []
    t = 0.0
    while t <= span + 1e-9:
        ticks.append((round(chart_x + t * scale, 2), _tick_label(t, step)))
        t += step
    return Timeline(
        rows=out_rows,
        ticks=ticks,
        height=TL_AXIS + max(1, len(rows)) * TL_ROW + 6,
        width=TL_WIDTH,
        chart_x=chart_x,
        chart_end=TL_WIDTH - TL_RIGHT_PAD,
        span_label=human_duration(span),
        has_attempts=bool(starts),
        t0_ms=int(t0.timestamp() * 1000),
        end_ms=int(end.timestamp() * 1000) if run.finished_at is not None else None,
    )


@dataclasses.dataclass
class TaskRow:
    """One task of the run, as the DAG, the timeline and the task table show it."""

    id: uuid.UUID  # the task run's
    task_id: uuid.UUID
    key: str
    type: str
    state: str
    max_attempts: int
    position_x: int | None
    position_y: int | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    depth: int
    attempts: list[Attempt]
    output_preview: str
    error_preview: str
    output_bytes: int | None = None  # size of the output's JSON text
    output_url: str = ""  # the whole output, when the preview is cut
    waiting_reason: str = ""  # a ready task's "waiting: ..." (engine.repositories.waiting)
    retry_at: dt.datetime | None = None  # a ready task run waiting for its next attempt: when it may start
    concurrency_key: str = ""  # its task's concurrency key rendered with the run's input; "" when none
    queue: str = ""  # the queue of the organization's own workers it waits on; "" for the shared workers
    # Ready on a worker queue: the queue's live workers (0: nothing will take it); None otherwise.
    queue_live_workers: int | None = None
    # What a person may do to it now (frontend.presenters.run_page.task_actions: "retry",
    # "mark_succeeded", "skip"), and the path its actions are posted under (".../tasks/<id>/").
    actions: tuple[str, ...] = ()
    actions_path: str = ""
    panel_url: str = ""  # the task's panel (frontend.views.tasks)
    skip_reason: str = ""  # a skipped task run's SkipReason ('' for none)
    trigger_rule: str = "all_success"  # its task's (engine.states.TriggerRule)
    condition: str = ""  # its task's CEL condition ('' for none)

    @property
    def skip_reason_text(self) -> str:
        """Why it was skipped, in a sentence ('' unless it was skipped for a reason)."""
        if self.state != "skipped":
            return ""
        return skip_reason_text(self.skip_reason, trigger_rule=self.trigger_rule)

    @property
    def skip_reason_label(self) -> str:
        """Why it was skipped, in a few words ('' unless it was skipped for a reason)."""
        if self.state != "skipped":
            return ""
        return skip_reason_label(self.skip_reason, trigger_rule=self.trigger_rule)

    @property
    def duration(self) -> str:
        if self.started_at is None:
            return ""
        if self.finished_at is None:
            return human_duration(seconds_between(self.started_at, timezone.now())) if self.state == "running" else ""
        return human_duration(seconds_between(self.started_at, self.finished_at))
