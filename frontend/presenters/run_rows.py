"""Row markup of the run pages: the task table, the timeline rows and the event log.

The three lists that grow with a run are built here rather than in template loops: a
Django template row with a dozen variables costs ~0.3 ms, so 200 tasks and 200 events
would make the page several times slower than a 5-task one (bench/bench_pages.py); these
cost a few microseconds a row. Every interpolated text goes through ``_esc``
(html.escape, quotes included); the templates insert the results.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from html import escape as html_escape
from typing import TYPE_CHECKING

from django.utils.safestring import SafeString, mark_safe

from frontend.presenters.text import human_bytes, retry_at_html
from frontend.presenters.timeline import TL_BAR, TL_ROW, TaskRow, Timeline

if TYPE_CHECKING:  # run_page imports this module
    from frontend.presenters.run_page import LogBlock


@dataclasses.dataclass
class EventRow:
    seq: int
    created_at: dt.datetime
    task_key: str
    kind: str
    from_state: str
    to_state: str
    attempt: int | None
    detail: str


def _esc(value: object) -> str:
    return html_escape(str(value), quote=True)


#: Where the no-live-worker warning sends the reader (the workers page, the API keys page).
WORKERS_PATH = "/workers/"
API_KEYS_PATH = "/api-keys/"


def no_worker_warning(queue: str) -> str:
    """The warning of a task waiting on a queue no live worker polls (HTML, escaped)."""
    return (f'<span class="no-worker" role="alert">No worker is polling queue <code>{_esc(queue)}</code>: '
            f'start one with a worker key (<a href="{API_KEYS_PATH}">API keys</a>, '
            f'<a href="{WORKERS_PATH}">Workers</a>)</span>')


#: An action's button, its confirmation and its path under the task run's (engine.recovery).
TASK_ACTIONS = {
    "retry": ("Retry", "retry/", "Retry task {key}? It runs again as a new attempt, and so does every task "
              "downstream of it; the other tasks keep their state and outputs."),
    "skip": ("Skip", "skip/", "Skip task {key}? A skipped task does not fail its run; the tasks downstream of it "
             "are decided again as below a skipped task."),
    "mark_succeeded": ("Mark succeeded", "mark-succeeded/", "Mark task {key} succeeded with this output? The tasks "
                       "downstream of it that did not succeed then run, handed it."),
}


def render_task_actions(r: TaskRow, csrf_token: str) -> str:
    """The action forms of one task row (HTML, escaped): Retry and Skip buttons, and Mark
    succeeded with an output (JSON) and a reason; each POSTs with the CSRF token and asks
    for a confirmation first (run-page.js: ``data-confirm``)."""
    if not r.actions:
        return ""
    csrf = f'<input type="hidden" name="csrfmiddlewaretoken" value="{_esc(csrf_token)}">'
    forms = []
    for action in ("retry", "skip"):
        if action in r.actions:
            label, path, confirm = TASK_ACTIONS[action]
            forms.append(
                f'<form method="post" action="{_esc(r.actions_path + path)}" class="inline" '
                f'data-confirm="{_esc(confirm.format(key=r.key))}">{csrf}'
                f'<button type="submit" class="button small" data-action="{action}-task">{label}</button></form>')
    if "mark_succeeded" in r.actions:
        label, path, confirm = TASK_ACTIONS["mark_succeeded"]
        forms.append(
            f'<details class="mark-succeeded"><summary class="button small">{label}…</summary>'
            f'<form method="post" action="{_esc(r.actions_path + path)}" class="stacked" '
            f'data-confirm="{_esc(confirm.format(key=r.key))}">{csrf}'
            f'<label>Output (JSON)<textarea name="output" rows="3" spellcheck="false">null</textarea></label>'
            f'<label>Reason <span class="muted">(optional)</span><input type="text" name="reason" maxlength="500">'
            f'</label><button type="submit" class="button small primary" data-action="mark_succeeded-task">{label}'
            f'</button></form></details>')
    return f'<div class="task-actions">{"".join(forms)}</div>'


def render_task_rows(rows: Sequence[TaskRow], *, csrf_token: str | None = None) -> SafeString:
    """The task table's ``<tr>``s: key (with its rendered concurrency key and its worker
    queue), type, state (with a ready task's wait reason, a skipped task's skip reason in
    words, and the warning when its queue has no live worker), attempts, duration, error, output; with ``csrf_token`` (someone
    who may operate runs) a last cell with the row's actions (``render_task_actions``)."""
    out = []
    for r in rows:
        key, state = _esc(r.key), _esc(r.state)
        error = (f'<span class="error-text" title="{_esc(r.error_preview)}">{_esc(r.error_preview)}</span>'
                 if r.error_preview else "")
        output = f'<code class="output">{_esc(r.output_preview)}</code>' if r.output_preview else ""
        waiting = f' <span class="wait-reason">{_esc(r.waiting_reason)}</span>' if r.waiting_reason else ""
        if r.retry_at is not None:  # waiting for its next attempt: when, rather than "retry backoff"
            waiting = f' <span class="wait-reason retry-at">{retry_at_html(r.retry_at)}</span>'
        label = r.skip_reason_label
        if label:
            # The sentence (with a false condition's text, up to 2,000 characters) is the title;
            # the task's panel shows both.
            title = f"{label}: {r.condition}" if r.skip_reason == "condition_false" and r.condition else \
                r.skip_reason_text
            waiting += (f' <span class="skip-reason" data-skip-reason="{_esc(r.skip_reason)}" '
                        f'title="{_esc(title)}">{_esc(label)}</span>')
        # Rendered from the run's input: any characters at all.
        permit = (f'<div class="concurrency-key"><span class="muted">concurrency</span> '
                  f'<code>{_esc(r.concurrency_key)}</code></div>' if r.concurrency_key else "")
        if r.queue:
            permit += (f'<div class="worker-queue"><span class="muted">queue</span> '
                       f'<a href="{WORKERS_PATH}#queue-{_esc(r.queue)}"><code>{_esc(r.queue)}</code></a></div>')
        if r.queue_live_workers == 0:
            waiting += " " + no_worker_warning(r.queue)
        if r.output_url:
            output += (f' <a class="output-link" href="{_esc(r.output_url)}">whole output'
                       f' ({_esc(human_bytes(r.output_bytes or 0))})</a>')
        # The key opens the task's panel on the run page (htmx), or its own page without script.
        link = (f'<a class="task-link" href="{_esc(r.panel_url)}" hx-get="{_esc(r.panel_url)}" '
                f'hx-target="#task-panel" hx-swap="innerHTML show:#task-panel:top" hx-push-url="true">{key}</a>'
                if r.panel_url else key)
        out.append(
            f'<tr id="task-{key}" class="task-row state-{state}" data-task-key="{key}">'
            f'<td class="mono key">{link}{permit}</td><td><span class="type">{_esc(r.type)}</span></td>'
            f'<td><span class="badge state-{state}">{_esc(r.state.capitalize())}</span>{waiting}</td>'
            f'<td class="num">{len(r.attempts)}<span class="muted">/{r.max_attempts}</span></td>'
            # A running task's duration advances on the client from its start (live-clock.js).
            + (f'<td class="num duration" data-started="{r.started_at.isoformat()}">{_esc(r.duration)}</td>'
               if r.state == "running" and r.started_at is not None and r.finished_at is None
               else f'<td class="num duration">{_esc(r.duration)}</td>')
            + f'<td class="error-cell">{error}</td>'
            f'<td class="output-cell">{output}</td>'
            + (f'<td class="actions-cell">{render_task_actions(r, csrf_token)}</td>' if csrf_token is not None else "")
            + '</tr>'
        )
    return mark_safe("".join(out))  # noqa: S308 — every text above is escaped


def _ms(at: dt.datetime) -> int:
    return int(at.timestamp() * 1000)


def render_timeline_rows(timeline: Timeline, *, only: set[str] | None = None) -> SafeString:
    """The timeline's rows (those of the keys in ``only``, when given): a band, the task key
    and one bar per attempt — x/width attributes for its place now, and ``data-start`` /
    ``data-end`` (epoch milliseconds; no end while it runs) from which run-page.js redraws
    it as time passes."""
    out = []
    width = _num(timeline.width)
    for row in timeline.rows:
        if only is not None and row.key not in only:
            continue
        key = _esc(row.key)
        label = _esc(row.key if len(row.key) <= 26 else row.key[:25] + "…")
        bars = "".join(
            f'<rect class="tl-bar outcome-{a.outcome}" x="{_num(a.x)}" y="{_num(row.bar_y)}" '
            f'data-start="{_ms(a.start)}"' + (f' data-end="{_ms(a.end)}" ' if a.end else " ") +
            f'width="{_num(a.width)}" height="{_num(TL_BAR)}" rx="3"><title>{key} · {_esc(a.label)}'
            + (f" — {_esc(a.error)}" if a.error else "")
            + "</title></rect>"
            for a in row.attempts
        )
        out.append(
            f'<g class="tl-row" data-task-key="{key}"><rect class="tl-band" x="0" y="{_num(row.y)}" '
            f'width="{width}" height="{_num(TL_ROW)}"></rect>'
            f'<text class="tl-label" x="8" y="{_num(row.text_y)}">{label}</text>{bars}</g>'
        )
    return mark_safe("".join(out))  # noqa: S308 — every text above is escaped


def render_event_rows(events: Sequence[EventRow]) -> SafeString:
    """The event log's ``<tr>``s: seq, time, task, kind, from → to, detail."""
    out = []
    for e in events:
        kind = _esc(e.kind)
        transition = ""
        if e.from_state or e.to_state:
            transition = (f'<span class="st st-{_esc(e.from_state)}">{_esc(e.from_state or "·")}</span> → '
                          f'<span class="st st-{_esc(e.to_state)}">{_esc(e.to_state or "·")}</span>')
        attempt = f'<span class="muted">#{e.attempt}</span> ' if e.attempt else ""
        stamp = e.created_at.astimezone(dt.UTC)
        out.append(
            f'<tr data-seq="{e.seq}" class="event kind-{kind}"><td class="num mono">{e.seq}</td>'
            f'<td class="mono time" title="{stamp:%Y-%m-%d %H:%M:%S.%f} UTC">{stamp:%H:%M:%S}.{stamp.microsecond // 1000:03d}</td>'
            f'<td class="mono">{_esc(e.task_key or "—")}</td><td><span class="kind">{kind}</span></td>'
            f'<td class="transition">{transition}</td><td class="detail">{attempt}{_esc(e.detail)}</td></tr>\n'
        )
    return mark_safe("".join(out))  # noqa: S308 — every text above is escaped


def render_log_blocks(blocks: Sequence[LogBlock]) -> SafeString:
    """The worker log lines of the run page: per task run, a heading (key, attempt,
    generation, a link to the whole log) and its lines (time, level, message)."""
    out = []
    for b in blocks:
        key = _esc(b.key)
        note = (f' <span class="muted small">the last {len(b.lines)} lines of this attempt</span>'
                if b.truncated else "")
        lines = "".join(
            f'<span class="log-line level-{_esc(line.level)}"><span class="log-time">'
            f'{_clock(line.created_at)}</span> <span class="log-level">{_esc(line.level.upper())}</span> '
            f'{_esc(line.message)}</span>\n'
            for line in b.lines
        )
        out.append(
            f'<div class="task-log" id="log-{key}" data-task-key="{key}"><div class="task-log-head">'
            f'<a class="mono" href="#task-{key}">{key}</a> <span class="muted">attempt {b.attempt} · generation '
            f'{b.fencing_token}</span>{note} <a class="small" href="{_esc(b.url)}">whole log</a></div>'
            f'<pre class="log-lines">{lines}</pre></div>'
        )
    return mark_safe("".join(out))  # noqa: S308 — every text above is escaped


def _clock(at: dt.datetime) -> str:
    stamp = at.astimezone(dt.UTC)
    return f"{stamp:%H:%M:%S}.{stamp.microsecond // 1000:03d}"


def _num(value: float) -> str:
    """An SVG coordinate: no trailing ".0", at most two decimals."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return text or "0"
