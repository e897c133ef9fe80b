"""Backfills of cron triggers: one run per past instant of a trigger's schedule over a range.

A backfill names a trigger and a range (``start``, ``end``: dates or instants, read in the
trigger's time zone). Its instants are those of the trigger's schedule in that range by
the clock's own daylight-saving rules (``engine.triggers.instants_in_range``); each gets
one run, started oldest first through the normal start path (``cron.start_for_instant`` ->
``services.start_run``: the organization's runs-per-minute quota, the workflow's run limit,
the fair claim), with the trigger's input and the instant and data interval it is for
(``engine.states.RunSchedule``), trigger_source ``backfill``.

Idempotent: an instant is claimed through the trigger's firings (``trigger_firing_claim``,
``uniq_triggerfiring_instant``), the key the clock's own firings take, so a backfill
never starts a run for an instant that already has one, whoever fired it, and a second
backfill of the same range starts nothing. An instant whose firing failed (the clock
could not start its run) is taken over and started.

Going on: ``advance_backfills`` (the ``advance_backfills`` actor, sent when a backfill is
made and by the clock every FLOWFORGE_CLOCK_BACKFILL_SECONDS) takes the running backfills
in turn, each for up to BATCH instants, one transaction per instant (the firing, the run
and the backfill's cursor together). A backfill waits, without holding anything, while
``max_active_runs`` of its runs are going, and while the organization's start quota is
full (until the quota's ``retry_after_seconds``). It fails, saying why, at an instant no
run can start for (no active version of the workflow, an input it refuses); the instants
before it keep their runs, and a new backfill of the range starts from there.

Limits: FLOWFORGE_BACKFILL_MAX_RUNS instants per backfill (a range that holds more is
refused, naming ``end``), one backfill going per trigger, FLOWFORGE_BACKFILL_MAX_RUNNING_PER_ORG
per organization, ``max_active_runs`` 1..BACKFILL_MAX_ACTIVE_RUNS. Instants after now are
never backfilled (they are the clock's): a range ending later is cut at now.

Creating and cancelling need ``run.operate`` (as starting runs does) and are audited
(``trigger.backfill_started``, ``trigger.backfill_cancelled``; the system records
``trigger.backfill_finished``); every run it starts records ``run.started``. A preview
needs ``read``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit import services as audit
from engine import dispatch, sql
from engine.cron import start_for_instant
from engine.models import ScheduledTrigger, TriggerBackfill, TriggerSource
from engine.repositories import runs
from engine.services import WorkflowNotStartable
from engine.states import BackfillState, priority_problem
from engine.triggers import TooManyInstants, instants_in_range, next_instant, run_schedule
from tenancy.actors import Actor
from tenancy.limits import QuotaExceeded
from tenancy.models import Membership
from tenancy.permissions import Action, can, require

log = logging.getLogger(__name__)

#: max_active_runs: the default, and the most a backfill may ask for.
DEFAULT_MAX_ACTIVE_RUNS = 10
BACKFILL_MAX_ACTIVE_RUNS = 100
#: Instants one backfill advances per pass before the next backfill's turn.
BATCH = 25
#: Seconds a backfill at its max_active_runs waits before it looks again (the clock's
#: FLOWFORGE_CLOCK_BACKFILL_SECONDS pass is what wakes it).
ACTIVE_RUNS_WAIT_SECONDS = 1.0
#: A backfill lets the clock fire its trigger's due instant first, when it came due this
#: recently (an older one means the clock is down: the backfill goes on).
CLOCK_FIRST_SECONDS = dt.timedelta(seconds=30)
#: How many of a preview's instants it lists.
PREVIEW_SAMPLE = 5
#: The earliest day a range may start on, in the trigger's time zone (the day the user
#: names: 1970-01-01 in Europe/Berlin starts at 1969-12-31T23:00Z, and is allowed). The
#: schedule's instants before 1970-01-01T00:00Z are ordinary timestamps to croniter and
#: PostgreSQL; the bound only keeps ranges to dates a schedule plausibly had.
EARLIEST_DAY = dt.date(1970, 1, 1)


class BackfillError(ValueError):
    """A backfill (or its preview) was refused for one field: ``field`` is ``start``,
    ``end``, ``range`` (the two together), ``max_active_runs``, ``priority`` or
    ``trigger``; ``message`` says why. Nothing was stored."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class BackfillConflict(BackfillError):
    """A backfill was refused because of what exists (a backfill of the trigger already
    going, the organization's backfills at their limit, ``expect_runs`` no longer the
    count, every instant of the range already with a run): an HTTP 409 naming ``field``."""


@dataclasses.dataclass(frozen=True)
class BackfillPreview:
    """What a backfill of a range would do. ``range_start``/``range_end``: the range as
    instants (UTC, both inclusive; the end cut at now); ``instants``: the schedule's
    instants in it; ``existing``: those that already have a run (or one being started);
    ``runs``: how many runs the backfill would start (``instants - existing``);
    ``first``/``last``: the first and last instant (None when there is none);
    ``sample``: the first PREVIEW_SAMPLE instants; ``end_cut``: the range asked for ended
    after now. Instants are aware datetimes in the trigger's zone."""

    trigger: ScheduledTrigger
    range_start: dt.datetime
    range_end: dt.datetime
    instants: int
    existing: int
    runs: int
    first: dt.datetime | None
    last: dt.datetime | None
    sample: list[dt.datetime]
    end_cut: bool
    all_instants: list[dt.datetime] = dataclasses.field(repr=False, default_factory=list)


def max_runs() -> int:
    """The most instants one backfill may cover (FLOWFORGE_BACKFILL_MAX_RUNS)."""
    return settings.FLOWFORGE_BACKFILL_MAX_RUNS


def parse_bound(value: Any, *, field: str, tz_name: str, end: bool) -> dt.datetime:
    """A range bound as an aware UTC datetime. ``value`` is a date (``2026-03-01``: the
    start of that day in zone ``tz_name`` for a start, its last microsecond for an end, so
    the end date is included), an ISO 8601 datetime with an offset or ``Z`` (that
    instant), or one without (a wall time in ``tz_name``); or a ``date``/``datetime``.
    A bound whose instant lies past what a UTC datetime holds (years 1..9999; a day of
    year 1 or 9999 in a zone far from UTC) is ``datetime.min``/``datetime.max`` in UTC:
    the range checks of ``preview_backfill`` then refuse it (a start) or cut it at now
    (an end). Raises BackfillError naming ``field``."""
    tz = ZoneInfo(tz_name)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise BackfillError(field, "required: a date (2026-03-01) or a date and time (2026-03-01T06:00)")
        try:
            value = dt.date.fromisoformat(text) if len(text) == 10 else dt.datetime.fromisoformat(text)
        except ValueError:
            raise BackfillError(field, f"{text[:40]!r} is not a date (2026-03-01) or an ISO 8601 date and time "
                                "(2026-03-01T06:00, 2026-03-01T05:00:00Z)") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=tz)
    elif isinstance(value, dt.date):
        # The day's first microsecond, or its last (the later pass of a repeated hour: fold 1),
        # on the day itself: the next day's midnight would not exist for 9999-12-31.
        value = (dt.datetime.combine(value, dt.time.max, tzinfo=tz).replace(fold=1) if end
                 else dt.datetime.combine(value, dt.time.min, tzinfo=tz))
    else:
        raise BackfillError(field, "required: a date (2026-03-01) or a date and time (2026-03-01T06:00)")
    try:
        return value.astimezone(dt.UTC)
    except (OverflowError, ValueError):
        # Its UTC instant is before year 1 or after year 9999: the low or the high edge.
        low = value.year < 5000
        return (dt.datetime.min if low else dt.datetime.max).replace(tzinfo=dt.UTC)


def local_day(instant: dt.datetime, tz_name: str) -> dt.date:
    """The day ``instant`` (aware) falls on in zone ``tz_name`` (``date.min``/``date.max``
    past the ends of what a datetime holds)."""
    try:
        return instant.astimezone(ZoneInfo(tz_name)).date()
    except (OverflowError, ValueError):
        return dt.date.min if instant.year < 5000 else dt.date.max


def preview_backfill(*, actor: Actor, trigger: ScheduledTrigger, start: Any, end: Any,
                     now: dt.datetime | None = None) -> BackfillPreview:
    """What a backfill of ``trigger`` from ``start`` to ``end`` (see ``parse_bound``) would
    start, without starting anything (``BackfillPreview``). Needs ``read``.

    Raises Forbidden, and BackfillError naming ``start`` (not a date, on a day before
    1970-01-01 in the trigger's zone, after now) or ``end`` (not a date, before ``start``, a range holding more than
    FLOWFORGE_BACKFILL_MAX_RUNS instants)."""
    require(actor.role, Action.READ)
    now = now or timezone.now()
    range_start = parse_bound(start, field="start", tz_name=trigger.timezone, end=False)
    range_end = parse_bound(end, field="end", tz_name=trigger.timezone, end=True)
    if local_day(range_start, trigger.timezone) < EARLIEST_DAY:
        raise BackfillError("start", f"must be {EARLIEST_DAY.isoformat()} or later in the trigger's time zone "
                            f"({trigger.timezone})")
    if range_start > now:
        raise BackfillError("start", "must be in the past: a backfill starts runs for instants that have passed "
                            "(the trigger fires the coming ones)")
    if range_end < range_start:
        raise BackfillError("end", "must not be before start")
    end_cut = range_end > now
    range_end = min(range_end, now)
    limit = max_runs()
    try:
        instants = instants_in_range(trigger.cron_expression, trigger.timezone, range_start, range_end, limit=limit)
    except TooManyInstants:
        raise BackfillError("end", f"the range holds more than {limit} instants of {trigger.cron_expression!r} "
                            f"(FLOWFORGE_BACKFILL_MAX_RUNS); backfill at most {limit} at a time, with an earlier "
                            "end") from None
    with connection.cursor() as cur:
        cur.execute(sql.queries["trigger_firing_count_fired"], {"trigger": trigger.pk, "instants": instants})
        existing = cur.fetchone()[0] if instants else 0
    tz = ZoneInfo(trigger.timezone)
    local = [i.astimezone(tz) for i in instants]
    return BackfillPreview(
        trigger=trigger, range_start=range_start, range_end=range_end, instants=len(instants), existing=existing,
        runs=len(instants) - existing, first=local[0] if local else None, last=local[-1] if local else None,
        sample=local[:PREVIEW_SAMPLE], end_cut=end_cut, all_instants=instants,
    )


def _check_options(max_active_runs: Any, priority: Any) -> tuple[int, int | None]:
    if max_active_runs is None:
        max_active_runs = DEFAULT_MAX_ACTIVE_RUNS
    if (isinstance(max_active_runs, bool) or not isinstance(max_active_runs, int)
            or not 1 <= max_active_runs <= BACKFILL_MAX_ACTIVE_RUNS):
        raise BackfillError("max_active_runs", f"must be a whole number from 1 to {BACKFILL_MAX_ACTIVE_RUNS}, "
                            f"got {max_active_runs!r}")
    if priority is not None and (problem := priority_problem(priority)) is not None:
        raise BackfillError("priority", problem)
    return max_active_runs, priority


def create_backfill(*, actor: Actor, trigger: ScheduledTrigger, start: Any, end: Any,
                    max_active_runs: int | None = None, priority: int | None = None,
                    expect_runs: int | None = None) -> TriggerBackfill:
    """Make a backfill of ``trigger`` from ``start`` to ``end`` (``preview_backfill``'s
    range) and wake the actor that starts its runs. ``max_active_runs`` (default
    DEFAULT_MAX_ACTIVE_RUNS): how many of its runs may be going at once (1: strictly one
    after the other); ``priority``: its runs' (default the trigger's); ``expect_runs``:
    when given, the count a preview showed, and the backfill is refused if the range now
    has another number of runs to start. Records ``trigger.backfill_started``. Needs
    ``run.operate``.

    Its ``total`` is the runs it sets out to start: the range's instants that have no run
    yet (an instant that gets one meanwhile, from the clock, is passed over and counted in
    ``skipped``). A range with nothing to start is refused, and nothing is made: a range
    holding no instant (BackfillError naming ``range``), or one whose every instant has a
    run already (BackfillConflict naming ``range``; the trigger's missed-instants note is
    cleared when the range covers it, as a backfill of it would). Raises Forbidden,
    BackfillError (the fields of ``preview_backfill``, ``max_active_runs``, ``priority``,
    ``range``) and BackfillConflict (``trigger``: a backfill of it is already going, or the
    organization has FLOWFORGE_BACKFILL_MAX_RUNNING_PER_ORG going; ``expect_runs``;
    ``range``)."""
    require(actor.role, Action.RUN_OPERATE)
    max_active_runs, priority = _check_options(max_active_runs, priority)
    org = actor.organization
    refusal: BackfillConflict | None = None
    with transaction.atomic():
        # The trigger's row first, then the audit chain's lock (the clock's order).
        locked = ScheduledTrigger.objects.for_organization(org).select_for_update().filter(pk=trigger.pk).first()
        if locked is None:
            raise BackfillError("trigger", "no such trigger (it was deleted)")
        preview = preview_backfill(actor=actor, trigger=locked, start=start, end=end)
        if expect_runs is not None and expect_runs != preview.runs:
            raise BackfillConflict("expect_runs", f"the range now has {preview.runs} runs to start, not "
                                   f"{expect_runs}; preview it again")
        if preview.instants == 0:
            raise BackfillError("range", f"the range holds no instant of {locked.cron_expression!r} "
                                f"({locked.timezone}): nothing to backfill")
        if preview.runs == 0:
            # Refused rather than made: a backfill that would start nothing must not answer as
            # if it had the range's instants to go through. The trigger's missed-instants note,
            # when the range covers it, is answered all the same (each of its instants has a run).
            _answer_missed_note(locked, preview)
            refusal = BackfillConflict("range", f"every instant of this range already has a run "
                                       f"({preview.instants} instant{'s' if preview.instants != 1 else ''}): "
                                       "nothing to backfill")
        else:
            # The organization's backfill lock (after the trigger's row, as every create takes
            # them): two creates on two triggers count each other's backfill.
            runs.lock(f"backfills:{org.pk}")
            going = TriggerBackfill.objects.for_organization(org).filter(state=BackfillState.RUNNING)
            if going.filter(trigger=locked).exists():
                raise BackfillConflict("trigger", f"a backfill of trigger {locked.name!r} is already going; cancel it "
                                       "or wait until it finishes")
            allowed = settings.FLOWFORGE_BACKFILL_MAX_RUNNING_PER_ORG
            if going.count() >= allowed:
                raise BackfillConflict("trigger", f"the organization has {allowed} backfills going, its limit "
                                       "(FLOWFORGE_BACKFILL_MAX_RUNNING_PER_ORG); wait until one finishes")
            backfill = TriggerBackfill(
                organization=org, trigger=locked, state=BackfillState.RUNNING, range_start=preview.range_start,
                range_end=preview.range_end, cron_expression=locked.cron_expression, timezone=locked.timezone,
                max_active_runs=max_active_runs, priority=locked.priority if priority is None else priority,
                total=preview.runs,
                next_instant=preview.all_instants[0] if preview.all_instants else None,
                created_by=actor.user or getattr(actor.api_key, "created_by", None),
            )
            try:
                with transaction.atomic():
                    backfill.save(force_insert=True)
            except IntegrityError:  # uniq_backfill_running_per_trigger: a concurrent one won
                raise BackfillConflict("trigger", f"a backfill of trigger {locked.name!r} is already going") from None
            audit.record("trigger.backfill_started", actor=actor, target=locked, metadata={
                "backfill": str(backfill.pk), "name": locked.name, "range_start": preview.range_start.isoformat(),
                "range_end": preview.range_end.isoformat(), "instants": preview.instants, "runs": preview.runs,
                "max_active_runs": max_active_runs, "priority": backfill.priority, "channel": actor.channel,
            })
            transaction.on_commit(_wake)
    if refusal is not None:
        raise refusal
    backfill.refresh_from_db()
    return backfill


def _wake() -> None:
    """Send the advance_backfills actor a message (never raises: the clock's pass goes on
    with the backfill anyway)."""
    try:
        dispatch.send("advance_backfills")
    except Exception:  # noqa: BLE001 - broker down: the clock's next pass
        log.warning("could not wake advance_backfills; the clock's next pass goes on with the backfill")


def cancel_backfill(*, actor: Actor, backfill: TriggerBackfill) -> TriggerBackfill:
    """Stop a running backfill (the runs it started go on; cancel them as runs). A
    backfill already finished is returned as it is. Records ``trigger.backfill_cancelled``
    with its counts. Needs ``run.operate`` (raises Forbidden)."""
    require(actor.role, Action.RUN_OPERATE)
    with transaction.atomic():
        locked = (TriggerBackfill.objects.for_organization(actor.organization).select_for_update(of=("self",))
                  .select_related("trigger").get(pk=backfill.pk))
        if locked.state != BackfillState.RUNNING:
            return locked
        locked.state = BackfillState.CANCELLED
        locked.finished_at = timezone.now()
        locked.next_instant = None
        locked.save(update_fields=["state", "finished_at", "next_instant"])
        audit.record("trigger.backfill_cancelled", actor=actor, target=locked.trigger, metadata={
            "backfill": str(locked.pk), "name": locked.trigger.name, "created_runs": locked.created_runs,
            "skipped": locked.skipped, "total": locked.total, "channel": actor.channel,
        })
    return locked


@dataclasses.dataclass(frozen=True)
class Pass:
    """What one ``advance_backfills`` pass did: ``started`` runs, and whether a backfill
    has more it could do now (``more``: its batch ran out)."""

    started: int
    more: bool


def advance_backfills(*, now: dt.datetime | None = None, limit: int = 50) -> Pass:
    """Let up to ``limit`` running backfills go on, longest waiting first, each for up to
    BATCH instants (``trigger_backfill_list_due``, ``idx_backfill_due``). Safe to run in
    many copies (each backfill's row is taken with SKIP LOCKED). Must not run inside a
    transaction of the caller's."""
    now = now or timezone.now()
    with connection.cursor() as cur:
        cur.execute(sql.queries["trigger_backfill_list_due"], {"now": now, "limit": limit})
        ids = [r[0] for r in cur.fetchall()]
    started, more = 0, False
    for backfill_id in ids:
        n, batch_used = advance_backfill(backfill_id)
        started += n
        more = more or batch_used
    return Pass(started=started, more=more)


def advance_backfill(backfill_id: uuid.UUID, *, batch: int = BATCH) -> tuple[int, bool]:
    """Fire up to ``batch`` instants of one running backfill, oldest first, one
    transaction each. Returns (runs started, True when it stopped only because the batch
    ran out). Gives up at once when another process holds the backfill."""
    started = 0
    for _ in range(batch):
        with transaction.atomic():
            # The trigger's row first (FOR KEY SHARE): the clock's tick, an edit and a delete
            # lock it first too, so no cycle can form; and while this instant is fired the
            # clock's tick passes the trigger by (SKIP LOCKED), its firings never waiting on
            # this one's unique firing row while this one waits on theirs.
            with connection.cursor() as cur:
                cur.execute(sql.queries["trigger_lock_for_backfill"], {"backfill": backfill_id})
                trigger_row = cur.fetchone()
            if trigger_row is None:
                return started, False
            backfill = (TriggerBackfill.objects.unscoped().select_for_update(skip_locked=True, of=("self",))
                        .select_related("trigger__organization", "created_by")
                        .filter(pk=backfill_id, state=BackfillState.RUNNING).first())
            if backfill is None:
                return started, False
            now = timezone.now()
            enabled, next_fire_at = trigger_row
            if enabled and next_fire_at is not None and now - CLOCK_FIRST_SECONDS <= next_fire_at <= now:
                # The trigger's own instant is due: the clock's tick goes first.
                backfill.not_before = now + dt.timedelta(seconds=ACTIVE_RUNS_WAIT_SECONDS)
                backfill.save(update_fields=["not_before"])
                return started, False
            step = _step(backfill, now)
        if step == "started":
            started += 1
        elif step != "skipped":
            return started, False
    return started, True


def _step(backfill: TriggerBackfill, now: dt.datetime) -> str:
    """Fire the backfill's next instant, in the caller's transaction, holding its row.
    Returns "started", "skipped" (the instant already had a run), "waiting" (its
    max_active_runs are going, or the start quota is full: ``not_before`` moved),
    "finished", "failed" or "cancelled" (its creator may no longer start runs)."""
    instant = backfill.next_instant
    if instant is None or instant > backfill.range_end:
        _finish(backfill, BackfillState.SUCCEEDED, now)
        return "finished"
    if not _creator_may_start_runs(backfill):
        # Authority does not outlive its holder (as a departed member's triggers are paused):
        # checked at each instant, so no lock of the member's removal is needed.
        backfill.error = "cancelled: the member who started it may no longer start runs (removed or demoted)"
        _finish(backfill, BackfillState.CANCELLED, now)
        return "cancelled"
    with connection.cursor() as cur:
        cur.execute(sql.queries["trigger_backfill_open_runs"], {"backfill": backfill.pk})
        going = cur.fetchone()[0]
    if going >= backfill.max_active_runs:
        backfill.not_before = now + dt.timedelta(seconds=ACTIVE_RUNS_WAIT_SECONDS)
        backfill.save(update_fields=["not_before"])
        return "waiting"
    trigger = backfill.trigger
    try:
        # One savepoint for the claim and the start: a refused start leaves the instant unclaimed.
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql.queries["trigger_firing_claim"], {
                "id": uuid.uuid4(), "org": backfill.organization_id, "trigger": trigger.pk, "instant": instant,
                "backfill": backfill.pk})
            claimed = cur.fetchone()
            if claimed is not None:
                run = start_for_instant(
                    trigger, run_schedule(backfill.cron_expression, backfill.timezone, instant),
                    source=TriggerSource.BACKFILL, priority=backfill.priority, triggered_by=backfill.created_by,
                    audit_metadata={"backfill": str(backfill.pk)})
                cur.execute(sql.queries["trigger_firing_set_run"], {"run": run.pk, "id": claimed[0]})
    except QuotaExceeded as exc:
        wait = exc.retry_after_seconds if exc.retry_after_seconds is not None else 5.0
        backfill.not_before = now + dt.timedelta(seconds=max(wait, ACTIVE_RUNS_WAIT_SECONDS))
        backfill.save(update_fields=["not_before"])
        return "waiting"
    except (WorkflowNotStartable, ValueError) as exc:
        backfill.error = f"no run could start for {instant.isoformat()}: {exc}"[:2000]
        _finish(backfill, BackfillState.FAILED, now)
        log.warning("backfill %s of trigger %s failed at %s: %s", backfill.pk, trigger.pk, instant, exc)
        return "failed"
    if claimed is None:
        backfill.skipped += 1
    else:
        backfill.created_runs += 1
    following = next_instant(backfill.cron_expression, backfill.timezone, instant)
    backfill.next_instant = following if following <= backfill.range_end else None
    # Behind every other backfill that is due: they take turns.
    backfill.not_before = now
    backfill.save(update_fields=["next_instant", "skipped", "created_runs", "not_before"])
    if backfill.next_instant is None:
        _finish(backfill, BackfillState.SUCCEEDED, now)
    return "started" if claimed is not None else "skipped"


def _answer_missed_note(trigger: ScheduledTrigger, covered: Any) -> None:
    """Clear ``trigger``'s missed-instants note when ``covered`` (a backfill or a preview:
    ``range_start``/``range_end``) holds all of its instants and they all have runs."""
    note = trigger.missed_instants
    if note and _covers(covered, note):
        ScheduledTrigger.objects.for_organization(trigger.organization_id).filter(
            pk=trigger.pk, missed_instants=note).update(missed_instants=None)


def _creator_may_start_runs(backfill: TriggerBackfill) -> bool:
    """True when the backfill has no creator (the system, a command) or its creator is
    still a member of its organization whose role may start runs (``run.operate``)."""
    if backfill.created_by_id is None:
        return True
    role = (Membership.objects.for_organization(backfill.organization_id).filter(user_id=backfill.created_by_id)
            .values_list("role", flat=True).first())
    return can(role, Action.RUN_OPERATE)


def _covers(backfill: TriggerBackfill | BackfillPreview, note: dict[str, Any]) -> bool:
    """True when the backfill's (or preview's) range holds every instant a missed-instants
    note names."""
    try:
        first = dt.datetime.fromisoformat(note["first_not_fired"])
        last = dt.datetime.fromisoformat(note["last_not_fired"])
    except (KeyError, TypeError, ValueError):
        return False
    return backfill.range_start <= first and last <= backfill.range_end


def _finish(backfill: TriggerBackfill, state: str, now: dt.datetime) -> None:
    """Close the backfill in ``state`` (succeeded, failed, or cancelled for its creator) and record
    ``trigger.backfill_finished`` (the organization's system actor) with its counts. A
    backfill that succeeded over the whole range of the trigger's missed-instants note
    clears the note (its instants all have runs now)."""
    backfill.state = state
    backfill.finished_at = now
    backfill.next_instant = None
    backfill.save(update_fields=["state", "finished_at", "next_instant", "error"])
    if state == BackfillState.SUCCEEDED:
        # Every instant the clock had left now has a run: the trigger's warning is answered.
        _answer_missed_note(backfill.trigger, backfill)
    audit.record("trigger.backfill_finished", actor=Actor.system(backfill.trigger.organization),
                 target=backfill.trigger,
                 metadata={"backfill": str(backfill.pk), "name": backfill.trigger.name, "state": state,
                           "created_runs": backfill.created_runs, "skipped": backfill.skipped,
                           "total": backfill.total, "error": backfill.error[:500]})
