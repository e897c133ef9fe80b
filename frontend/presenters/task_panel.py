"""The run page's task panel (issue 19): one task run whole, shaped for the templates.

``build_task_panel`` reads the task run through ``engine.task_detail.load`` (a constant
number of queries) and renders the parts that grow — each attempt's log lines, the events —
without template loops (as frontend.presenters.run_rows does). JSON documents (the task's
config as configured, outputs) are pretty-printed and cut to JSON_PREVIEW_CHARS; a cut one
links to the whole. ``run_input`` does the same for the run page's input card.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from html import escape as html_escape
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from engine import task_detail
from engine.outputs import is_summarized, offloaded_bytes
from engine.repositories.task_logs import StoredLine
from engine.trigger_rules import skip_reason_text
from frontend.presenters.run_page import event_rows
from frontend.presenters.run_rows import render_event_rows
from frontend.presenters.text import human_bytes, human_duration, retry_at, retry_at_html, seconds_between

#: Characters of a JSON document (config, output, input) shown before it is cut.
JSON_PREVIEW_CHARS = 20_000
#: Seconds between two refreshes of the panel of a task that is not finished (htmx polling).
POLL_SECONDS = 2


def pretty_json(value: Any, *, limit: int = JSON_PREVIEW_CHARS) -> tuple[str, bool]:
    """``value`` as indented JSON and whether it was cut to ``limit`` characters."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    if len(text) <= limit:
        return text, False
    return text[:limit] + "\n…", True


@dataclasses.dataclass
class OutputView:
    """An output as the panel shows it: pretty JSON, or (too large to inline) its size and link."""

    text: str = ""
    cut: bool = False
    bytes: int | None = None
    url: str = ""
    present: bool = False


def _output(task_run, url: str) -> OutputView:
    if is_summarized(task_run):
        return OutputView(bytes=offloaded_bytes(task_run.output_inline) or task_run.output_bytes, url=url, present=True)
    if task_run.output_bytes is None:
        return OutputView()
    text, cut = pretty_json(task_run.output_inline)
    return OutputView(text=text, cut=cut, bytes=task_run.output_bytes, url=url, present=True)


@dataclasses.dataclass
class AttemptView:
    attempt: task_detail.AttemptDetail
    duration: str
    logs_html: SafeString
    logs_url: str
    output: OutputView | None

    @property
    def label(self) -> str:
        return self.attempt.outcome.replace("_", " ")


@dataclasses.dataclass
class MarkedView:
    """A task run a person marked succeeded or skipped (engine.recovery), as its panel shows
    it: the action, who, when, why, and the output given (for a success)."""

    action: str  # "succeeded" or "skipped"
    by: str
    at: dt.datetime
    reason: str
    output: OutputView | None


def _marked(detail: task_detail.TaskDetail, output_url: str) -> MarkedView | None:
    """The person's mark that put the task run in its state, when the latest event that
    moved it is a ``marked_succeeded`` or ``marked_skipped`` (None otherwise)."""
    tr = detail.task_run
    moved = [e for e in detail.events if e.to_state]
    last = moved[-1] if moved else None
    if last is None or last.kind not in ("marked_succeeded", "marked_skipped") or last.to_state != tr.state:
        return None
    info = last.detail if isinstance(last.detail, dict) else {}
    return MarkedView(action=last.to_state, by=str(info.get("by") or "someone"), at=last.created_at,
                      reason=str(info.get("reason") or ""),
                      output=_output(tr, output_url) if last.to_state == "succeeded" else None)


@dataclasses.dataclass
class UpstreamView:
    key: str
    label: str
    state: str
    panel_url: str
    output: OutputView


@dataclasses.dataclass
class TaskPanel:
    """What the task panel template shows."""

    detail: task_detail.TaskDetail
    run_id: uuid.UUID
    key: str
    type: str
    panel_url: str
    run_url: str
    logs_url: str
    api_url: str
    config_json: str
    config_cut: bool
    upstream: list[UpstreamView]
    attempts: list[AttemptView]
    events_html: SafeString
    poll_seconds: int = POLL_SECONDS
    retry_at_html: SafeString | None = None  # "retrying at <time>" while it waits for its next attempt
    marked: MarkedView | None = None  # a person marked it succeeded or skipped (its state now)

    @property
    def task_run(self):
        return self.detail.task_run

    @property
    def is_terminal(self) -> bool:
        return self.detail.is_terminal

    @property
    def skip_reason_text(self) -> str:
        """Why the task run was skipped, in words ('' unless skipped for a reason)."""
        tr = self.detail.task_run
        if tr.state != "skipped":
            return ""
        return skip_reason_text(tr.skip_reason, trigger_rule=tr.task.trigger_rule)


def render_log_lines(lines: Sequence[StoredLine]) -> SafeString:
    """An attempt's log lines: time, stream, level, message (every text escaped)."""
    out = []
    for line in lines:
        stamp = line.created_at.astimezone(dt.UTC)
        level = _esc(line.level)
        out.append(
            f'<span class="log-line level-{level} stream-{_esc(line.stream)}"><span class="log-time">'
            f'{stamp:%H:%M:%S}.{stamp.microsecond // 1000:03d}</span> <span class="log-stream">'
            f'{_esc(line.stream)}</span> <span class="log-level">{_esc(line.level.upper())}</span> '
            f'{_esc(line.message)}</span>\n'
        )
    return mark_safe("".join(out))  # noqa: S308 — every text above is escaped


def _esc(value: object) -> str:
    return html_escape(str(value), quote=True)


def task_panel_url(run_id: Any, task_run_id: Any) -> str:
    return reverse("frontend:run_task", kwargs={"run_id": run_id, "task_run_id": task_run_id})


def build_task_panel(org, run_id: uuid.UUID, task_run_id: uuid.UUID) -> TaskPanel:
    """The panel of task run ``task_run_id`` of run ``run_id`` of ``org`` (ObjectNotFound, a
    404, for any other). The queries of ``engine.task_detail.load``, nothing more."""
    detail = task_detail.load(org, run_id, task_run_id)
    tr = detail.task_run
    run_url = reverse("frontend:run_detail", kwargs={"run_id": run_id})
    base = f"{run_url}tasks/"
    logs_url = f"{base}{tr.pk}/logs/"
    output_url = f"{base}{tr.pk}/output/"
    now = timezone.now()
    attempts = [
        AttemptView(
            attempt=a,
            duration=human_duration(seconds_between(a.started_at, a.finished_at or now)),
            logs_html=render_log_lines(a.logs),
            logs_url=f"{logs_url}?fencing_token={a.fencing_token}",
            output=_output(tr, output_url) if a.succeeded and tr.state == "succeeded" else None,
        )
        for a in detail.attempts
    ]
    upstream = [
        UpstreamView(key=u.key, label=u.label, state=u.task_run.state, panel_url=f"{base}{u.task_run.pk}/",
                     output=_output(u.task_run, f"{base}{u.task_run.pk}/output/"))
        for u in detail.upstream
    ]
    keys = {tr.pk: tr.task.key}
    events = event_rows(((e.seq, e.created_at, e.task_run_id, e.kind, e.from_state, e.to_state, e.attempt, e.detail)
                         for e in detail.events), keys)
    config_json, config_cut = pretty_json(detail.config)
    return TaskPanel(
        detail=detail, run_id=run_id, key=tr.task.key, type=tr.task.type, panel_url=f"{base}{tr.pk}/",
        run_url=run_url, logs_url=logs_url,
        api_url=reverse("api:run-task-detail", kwargs={"run_id": run_id, "pk": tr.pk}),
        config_json=config_json, config_cut=config_cut, upstream=upstream, attempts=attempts,
        events_html=render_event_rows(events),
        retry_at_html=mark_safe(retry_at_html(at)) if (at := retry_at(tr.state, tr.not_before, now)) else None,  # noqa: S308 — no input in it
        marked=_marked(detail, output_url),
    )


@dataclasses.dataclass
class InputView:
    """The run's input on the run page: pretty JSON when whole, else its first characters."""

    text: str
    cut: bool
    url: str
    empty: bool
    shown: int = 0  # characters of the input's JSON text shown, when cut


def run_input(text: str | None, *, url: str, limit: int = JSON_PREVIEW_CHARS) -> InputView:
    """The run page's view of a run input whose JSON text, read cut to ``limit`` + 1
    characters in the database, is ``text``."""
    if not text or text == "{}":
        return InputView(text="{}", cut=False, url=url, empty=True)
    if len(text) <= limit:
        try:
            return InputView(text=pretty_json(json.loads(text), limit=limit)[0], cut=False, url=url, empty=False)
        except ValueError:
            pass
    return InputView(text=text[:limit] + "…", cut=True, url=url, empty=False, shown=limit)


__all__ = ["JSON_PREVIEW_CHARS", "POLL_SECONDS", "InputView", "TaskPanel", "build_task_panel", "human_bytes",
           "pretty_json", "render_log_lines", "run_input", "task_panel_url"]
