"""Cron triggers: validation and the create/update/pause/resume/delete actions.

A trigger names a workflow (its latest active version runs), a cron expression
(croniter's five-field syntax, with optional seconds as a sixth field not allowed),
an IANA time zone and an input document. ``next_fire_at`` (UTC) is the next instant
of the expression in the trigger's zone; the clock's tick fires due triggers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import services as audit
from engine import input_schema
from engine.limit_keys import render_definition_keys
from engine.models import CatchUpPolicy, ScheduledTrigger, Workflow, WorkflowState
from engine.states import RunSchedule, priority_problem
from flowforge.jsonb import stored_bytes, strip_nul
from tenancy.actors import Actor
from tenancy.models import Membership
from tenancy.permissions import Action, require

NAME_MAX = 200


class TriggerError(ValueError):
    """A trigger was refused. ``field`` names the offending field; ``violations`` (for an
    ``input`` its workflow's input schema refuses) lists each as ``input_schema.Violation``."""

    def __init__(self, field: str, message: str, *, violations: list[input_schema.Violation] | None = None):
        self.field = field
        super().__init__(f"{field}: {message}")
        self.message = message
        self.violations = violations


def validate_cron(expression: str) -> str:
    """Return the normalized expression or raise TriggerError('cron_expression', ...)."""
    if not isinstance(expression, str) or not expression.strip():
        raise TriggerError("cron_expression", "required, e.g. '*/15 * * * *'")
    expr = " ".join(expression.split())
    if len(expr.split(" ")) != 5:
        raise TriggerError("cron_expression", f"{expression!r} must have 5 fields (minute hour day month weekday)")
    if not croniter.is_valid(expr):
        raise TriggerError("cron_expression", f"{expression!r} is not a valid cron expression")
    backwards = _backwards_range(expr)
    if backwards:
        raise TriggerError("cron_expression", f"{expression!r}: {backwards}")
    try:  # valid syntax that never fires (e.g. February 30th) is refused too
        croniter(expr, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)).get_next(dt.datetime)
    except Exception:
        raise TriggerError("cron_expression", f"{expression!r} never fires") from None
    return expr


# Each field's name and bounds, and the names a field may use for its numbers (cron's).
_CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12),
                ("day-of-week", 0, 6))
_CRON_NAMES = ({}, {}, {},
               {m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep",
                                                "oct", "nov", "dec"))},
               {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))})


def _backwards_range(expression: str) -> str | None:
    """Why ``expression`` (5 fields, syntax already valid) has a range whose start is after
    its end (``1-0``, ``FRI-MON``), or None. croniter wraps such a range around (``1-0`` in
    the minute field fired every minute); cron refuses it, and so do we, saying how to
    write a range across the end."""
    for (name, low, high), names, field in zip(_CRON_FIELDS, _CRON_NAMES, expression.split(" "), strict=True):
        for part in field.split(","):
            span = part.split("/", 1)[0]
            if "-" not in span:
                continue
            first, last = (names.get(x.lower(), x) for x in span.split("-", 1))
            try:
                a, b = int(first), int(last)
            except ValueError:
                continue
            if a > b:  # (7, Sunday at the end of the week, is never a start after an end)
                return (f"the {name} range {span!r} runs backwards ({a} is after {b}); a range goes from low to "
                        f"high: write one across the end as two, e.g. {a}-{high},{low}-{b}")
    return None


def validate_timezone(name: str) -> str:
    """Return ``name`` if it is an IANA time zone, else raise TriggerError('timezone', ...)."""
    if not isinstance(name, str) or not name:
        raise TriggerError("timezone", "required, an IANA time zone such as 'Europe/Berlin' or 'UTC'")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise TriggerError("timezone", f"{name!r} is not an IANA time zone (e.g. 'Europe/Berlin')") from None
    if name not in available_timezones() and name != "UTC":
        raise TriggerError("timezone", f"{name!r} is not an IANA time zone (e.g. 'Europe/Berlin')")
    return name


def _fixed_hours(expression: str) -> bool:
    """True when the hour field names specific hours ("2", "1-3", "2,14"), not every hour."""
    hour = expression.split(" ")[1]
    return not (hour == "*" or hour.startswith("*/"))


def next_instant(expression: str, tz_name: str, after: dt.datetime) -> dt.datetime:
    """The first instant of ``expression`` in zone ``tz_name`` strictly after ``after``, in UTC.

    Daylight-saving time, as cron has always done it: a wall-clock time that a spring-
    forward skips fires once, at the shifted time; a wall-clock time that a fall-back
    repeats fires once (the first occurrence) when the expression names specific hours,
    while an expression over every hour ("*/15 * * * *") fires through both hours, since
    each of those instants is a real, distinct moment.
    """
    tz = ZoneInfo(tz_name)
    cursor = after
    for _ in range(4):
        candidate = croniter(expression, cursor.astimezone(tz)).get_next(dt.datetime).astimezone(dt.UTC)
        local = candidate.astimezone(tz)
        if local.fold == 1 and _fixed_hours(expression):
            earlier = local.replace(fold=0)
            if earlier.utcoffset() != local.utcoffset():  # an ambiguous wall time: its second pass
                cursor = candidate
                continue
        return candidate
    return candidate


# How far before croniter's previous instant ``previous_instant`` looks when that one is not
# an instant of ``next_instant``'s (a fall-back hour's second pass): more than any DST shift.
_DST_SLACK = dt.timedelta(hours=3)
_MICROSECOND = dt.timedelta(microseconds=1)


def previous_instant(expression: str, tz_name: str, before: dt.datetime) -> dt.datetime:
    """The last instant of ``expression`` in zone ``tz_name`` strictly before ``before``, in
    UTC: the instant whose ``next_instant`` is the first one at or after ``before`` (the
    same daylight-saving rules). Raises ValueError for an expression without one."""
    tz = ZoneInfo(tz_name)
    raw = croniter(expression, before.astimezone(tz)).get_prev(dt.datetime).astimezone(dt.UTC)
    # croniter's answer, when next_instant agrees that it is an instant and that none lies
    # between it and ``before`` (the usual case: two croniter calls).
    if (next_instant(expression, tz_name, raw - _MICROSECOND) == raw
            and next_instant(expression, tz_name, raw) >= before):
        return raw
    slack = _DST_SLACK
    for _ in range(3):  # otherwise walk forward from before it, with next_instant's rules
        cursor, found = raw - slack, None
        while (candidate := next_instant(expression, tz_name, cursor)) < before:
            found = cursor = candidate
        if found is not None:
            return found
        slack *= 24
    raise ValueError(f"{expression!r} has no instant before {before.isoformat()}")


def run_schedule(expression: str, tz_name: str, instant: dt.datetime) -> RunSchedule:
    """The RunSchedule of a run for ``instant`` (an instant of ``expression`` in ``tz_name``):
    its data interval is [the schedule's previous instant, ``instant``)."""
    instant = instant.astimezone(dt.UTC)
    return RunSchedule(scheduled_for=instant, data_interval_start=previous_instant(expression, tz_name, instant),
                       data_interval_end=instant)


class TooManyInstants(ValueError):
    """A range holds more instants than the caller's ``limit``; ``limit`` says how many."""

    def __init__(self, limit: int):
        self.limit = limit
        super().__init__(f"more than {limit} instants")


def instants_in_range(expression: str, tz_name: str, start: dt.datetime, end: dt.datetime, *,
                      limit: int) -> list[dt.datetime]:
    """Every instant of ``expression`` in ``tz_name`` from ``start`` to ``end`` (both
    inclusive), oldest first, in UTC, by ``next_instant``'s daylight-saving rules. Raises
    TooManyInstants as soon as there are more than ``limit`` (so a huge range costs at
    most ``limit`` + 1 steps)."""
    out: list[dt.datetime] = []
    cursor = next_instant(expression, tz_name, start - _MICROSECOND)
    while cursor <= end:
        out.append(cursor)
        if len(out) > limit:
            raise TooManyInstants(limit)
        cursor = next_instant(expression, tz_name, cursor)
    return out


def preview(expression: str, tz_name: str, *, count: int = 5, after: dt.datetime | None = None) -> list[dt.datetime]:
    """The next ``count`` fire instants, in the trigger's zone."""
    expr, tz = validate_cron(expression), validate_timezone(tz_name)
    out, cursor = [], after or timezone.now()
    for _ in range(count):
        cursor = next_instant(expr, tz, cursor)
        out.append(cursor.astimezone(ZoneInfo(tz)))
    return out


def _clean(actor: Actor, data: dict[str, Any], *, partial: bool, current: ScheduledTrigger | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not partial or "name" in data:
        name = (data.get("name") or "").strip()
        if not name or len(name) > NAME_MAX:
            raise TriggerError("name", f"required, 1 to {NAME_MAX} characters")
        out["name"] = name
    if not partial or "workflow_name" in data:
        wf = data.get("workflow_name")
        if not isinstance(wf, str) or not wf:
            raise TriggerError("workflow_name", "required: the name of a workflow")
        if not Workflow.objects.for_organization(actor.organization).filter(name=wf).exists():
            raise TriggerError("workflow_name", f"no workflow named {wf!r}")
        out["workflow_name"] = wf
    if not partial or "cron_expression" in data:
        out["cron_expression"] = validate_cron(data.get("cron_expression"))
    if not partial or "timezone" in data:
        out["timezone"] = validate_timezone(data.get("timezone", "UTC"))
    if not partial or "input" in data:
        value = data.get("input", {}) if not partial else data["input"]
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise TriggerError("input", "must be a JSON object")
        try:
            text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise TriggerError("input", f"is not storable JSON ({exc})") from None
        size = stored_bytes(text)  # as its runs' inputs are (engine.services.check_input_size)
        if size > settings.FLOWFORGE_MAX_INPUT_BYTES:
            raise TriggerError("input", f"is {size} bytes of JSON as stored (numbers are stored without an "
                                        f"exponent); at most {settings.FLOWFORGE_MAX_INPUT_BYTES} "
                                        "(FLOWFORGE_MAX_INPUT_BYTES)")
        out["input"] = strip_nul(value)
    if not partial or "catch_up" in data:
        policy = data.get("catch_up", CatchUpPolicy.LATEST)
        if policy not in CatchUpPolicy.values:
            raise TriggerError("catch_up", f"must be one of {', '.join(CatchUpPolicy.values)}")
        out["catch_up"] = policy
    if not partial or "priority" in data:
        priority = data.get("priority", 0)
        if priority is None:
            priority = 0
        if (problem := priority_problem(priority)) is not None:
            raise TriggerError("priority", problem)
        out["priority"] = priority
    if "enabled" in data or not partial:
        enabled = data.get("enabled", True)
        if not isinstance(enabled, bool):
            raise TriggerError("enabled", "must be true or false")
        out["enabled"] = enabled
    if "input" in out or "workflow_name" in out:
        _check_input_starts(actor, workflow_name=out.get("workflow_name", getattr(current, "workflow_name", None)),
                            run_input=out.get("input", getattr(current, "input", None) or {}))
    return out


def _check_input_starts(actor: Actor, *, workflow_name: str | None, run_input: dict[str, Any]) -> None:
    """Refuse (TriggerError naming ``input``) an input with which no firing could start a
    run of the workflow version the firings run (the name's latest active one, as
    engine.cron picks it): one that cannot fill a concurrency key, rendered as start_run
    renders it (``limit_keys.render_definition_keys``), or one its ``input_schema``
    refuses (the error's ``violations`` list each; defaults are filled in at each firing,
    not stored on the trigger). Without an active version there is nothing to check
    against (each firing fails, saying so, until there is one)."""
    if not workflow_name:
        return
    latest = (
        Workflow.objects.for_organization(actor.organization)
        .filter(name=workflow_name, state=WorkflowState.ACTIVE)
        .order_by("-version")
        .values_list("definition", "version", "input_schema_json")
        .first()
    )
    if latest is None:
        return
    definition, version, schema_text = latest
    # As start_run does it: the schema (its defaults filled in) first, then the keys.
    filled, violations = input_schema.check_input(schema_text, strip_nul(run_input),
                                                  organization_id=actor.organization.pk)
    if violations:
        raise TriggerError("input", f"does not match the input schema of {workflow_name} v{version}: "
                           f"{input_schema.summary(violations)}", violations=violations)
    try:
        render_definition_keys(definition, filled)
    except ValueError as exc:
        raise TriggerError("input", f"no run could start with it: {exc}") from None


@dataclasses.dataclass(frozen=True)
class InputRejection:
    """A trigger whose input the latest active version of its workflow refuses: every
    firing will fail until the input (or the schema) changes."""

    workflow_name: str
    version: int
    violations: list[input_schema.Violation]

    def message(self) -> str:
        return (f"its input does not match the input schema of {self.workflow_name} v{self.version}: "
                f"{input_schema.summary(self.violations)}")


def input_rejections(organization, trigger_list) -> dict[Any, InputRejection]:
    """{trigger id: InputRejection} for the triggers of ``trigger_list`` whose input the
    latest active version of their workflow refuses (its ``input_schema``); the others are
    absent. One query (the latest active version of each name), whatever their number."""
    trigger_list = list(trigger_list)
    names = {t.workflow_name for t in trigger_list}
    if not names:
        return {}
    latest = {
        name: (version, text)
        for name, version, text in Workflow.objects.for_organization(organization)
        .filter(name__in=names, state=WorkflowState.ACTIVE)
        .order_by("name", "-version")
        .distinct("name")
        .values_list("name", "version", "input_schema_json")
    }
    out: dict[Any, InputRejection] = {}
    for trigger in trigger_list:
        version, text = latest.get(trigger.workflow_name, (None, None))
        if not text:
            continue
        _, violations = input_schema.check_input(text, strip_nul(trigger.input or {}),
                                                 organization_id=getattr(organization, "pk", organization))
        if violations:
            out[trigger.pk] = InputRejection(trigger.workflow_name, version, violations)
    return out


def record_rejected_inputs(*, actor: Actor, workflow: Workflow) -> int:
    """After ``workflow`` became active (a new version, a restore): for each cron trigger of
    its name whose input it refuses, when it is the version their firings run (the latest
    active one), record ``trigger.input_rejected`` (target the trigger; metadata the
    version and each violation's path and keyword, never the input's values) in the
    caller's transaction. Returns how many were recorded. The triggers are not changed:
    each firing fails and records why on its TriggerFiring, and the trigger's API and
    page show the rejection, until its input is fixed."""
    if not workflow.input_schema_json:
        return 0
    newest = (Workflow.objects.for_organization(actor.organization)
              .filter(name=workflow.name, state=WorkflowState.ACTIVE)
              .order_by("-version").values_list("pk", flat=True).first())
    if newest != workflow.pk:
        return 0
    affected = ScheduledTrigger.objects.for_organization(actor.organization).filter(
        workflow_name=workflow.name).order_by("name")
    rejected = input_rejections(actor.organization, affected)
    for trigger in affected:
        found = rejected.get(trigger.pk)
        if found is None:
            continue
        audit.record("trigger.input_rejected", actor=actor, target=trigger, metadata={
            "name": trigger.name, "workflow": workflow.name, "version": workflow.version,
            "violations": [{"path": v["path"], "keyword": v["keyword"]} for v in found.violations[:20]],
            "violation_count": len(found.violations)})
    return len(rejected)


def _schedule_fields(trigger: ScheduledTrigger) -> list[str]:
    """A new trigger's next_fire_at: its first instant from now on."""
    trigger.next_fire_at = next_instant(trigger.cron_expression, trigger.timezone, timezone.now() - _MICROSECOND)
    return ["next_fire_at"]


def next_fire_after_edit(*, expression: str, tz_name: str, was_enabled: bool, pending: dt.datetime | None,
                         last_fired: dt.datetime | None, now: dt.datetime) -> dt.datetime:
    """The next_fire_at of a trigger whose schedule (expression, zone) or state was just
    changed, under its row lock, at ``now``. ``pending`` is its next_fire_at before the
    change (every instant before it has been fired or decided by the clock);
    ``last_fired`` its last_fired_at.

    - ``pending`` already due (<= now) on a trigger that was enabled: kept. The instant came
      due under the schedule then in force and the clock has not fired it yet (its tick
      is periodic); it fires at the next tick, then the new schedule goes on from it. An
      equivalent expression saved a second after 02:40:00, before the tick, still fires
      02:40 (recomputing from now had moved it to 02:41 and lost it).
    - otherwise: the new schedule's first instant at or after ``now`` (nor at or before
      ``last_fired``). An instant the old schedule had still to fire (``pending`` in the
      future) is then kept whenever the new schedule contains it, being at or after now.
      An instant of the new schedule already past when the change is saved, which the
      old schedule did not have, does not fire; nor do the instants of a paused period
      (``was_enabled`` False: a resume).

    So a change never skips an instant that both the old and the new schedule contain, and
    never fires one twice (the clock's firings are unique per instant besides).
    """
    if was_enabled and pending is not None and pending <= now:
        return pending
    floor = now - _MICROSECOND
    if last_fired is not None and last_fired > floor:
        floor = last_fired
    return next_instant(expression, tz_name, floor)


def _input_digest(value: dict[str, Any]) -> str:
    """SHA-256 of the canonical input: the audit log records that the input changed,
    never the input itself (it may carry anything, secrets included)."""
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _snapshot(t: ScheduledTrigger) -> dict[str, Any]:
    return {"name": t.name, "workflow_name": t.workflow_name, "cron_expression": t.cron_expression,
            "timezone": t.timezone, "catch_up": t.catch_up, "enabled": t.enabled, "priority": t.priority,
            "input_sha256": _input_digest(t.input or {})}


def create_trigger(*, actor: Actor, data: dict[str, Any]) -> ScheduledTrigger:
    """Create a trigger from ``data`` (name, workflow_name, cron_expression, timezone,
    input, catch_up, enabled, priority: of the runs it starts, a whole number -10..10,
    default 0). Raises Forbidden or TriggerError (naming the field; ``input`` when it
    cannot fill a concurrency key of the workflow's latest active version or its
    ``input_schema`` refuses it, the latter with ``violations``)."""
    require(actor.role, Action.WORKFLOW_EDIT)
    fields = _clean(actor, data, partial=False, current=None)
    creator = actor.user or getattr(actor.api_key, "created_by", None)  # a key acts for its creator
    trigger = ScheduledTrigger(organization=actor.organization, created_by=creator, **fields)
    _schedule_fields(trigger)
    try:
        with transaction.atomic():
            trigger.save(force_insert=True)
            audit.record("trigger.created", actor=actor, target=trigger, metadata=_snapshot(trigger))
    except IntegrityError:
        raise TriggerError("name", f"a trigger named {fields['name']!r} already exists") from None
    return trigger


def update_trigger(*, actor: Actor, trigger: ScheduledTrigger, data: dict[str, Any]) -> ScheduledTrigger:
    """Change some fields of ``trigger``; a schedule change recomputes next_fire_at
    (``next_fire_after_edit``: never skipping an instant both schedules contain). A
    change of ``input`` or ``workflow_name`` is refused (TriggerError naming ``input``)
    when the two together cannot fill a concurrency key or break the input schema, as
    ``create_trigger``.
    Records ``trigger.changed`` (or paused/resumed when only ``enabled`` flips)."""
    require(actor.role, Action.WORKFLOW_EDIT)
    fields = _clean(actor, data, partial=True, current=trigger)
    with transaction.atomic():
        locked = ScheduledTrigger.objects.for_organization(actor.organization).select_for_update().get(pk=trigger.pk)
        before = _snapshot(locked)
        pending = locked.next_fire_at
        for k, v in fields.items():
            setattr(locked, k, v)
        after = _snapshot(locked)
        if before == after:
            return locked
        update = list(fields)
        if {"cron_expression", "timezone", "enabled"} & set(fields):
            # "now" is read under the row lock: a firing that held it is committed and seen.
            locked.next_fire_at = next_fire_after_edit(
                expression=locked.cron_expression, tz_name=locked.timezone, was_enabled=before["enabled"],
                pending=pending, last_fired=locked.last_fired_at, now=timezone.now())
            update.append("next_fire_at")
        adopted = None
        if locked.enabled and not before["enabled"]:
            adopted = _adopt_if_orphaned(actor, locked)
            if adopted is not None:
                update.append("created_by")
        try:
            with transaction.atomic():
                locked.save(update_fields=update)
        except IntegrityError:
            raise TriggerError("name", f"a trigger named {fields.get('name')!r} already exists") from None
        diff = audit.changes(before, after)
        if set(diff) == {"enabled"}:
            action = "trigger.resumed" if locked.enabled else "trigger.paused"
        else:
            action = "trigger.changed"
        if adopted is not None:
            diff["created_by"] = adopted
        audit.record(action, actor=actor, target=locked, metadata={"changes": diff})
    return locked


def _adopt_if_orphaned(actor: Actor, trigger: ScheduledTrigger) -> dict[str, Any] | None:
    """On a resume: when the trigger's creator is no longer a member of its organization,
    the resuming person (a key's creator for a key) becomes its creator, so it never
    fires again on the authority of someone who left. Returns the change for the audit
    record ({"before": email, "after": email}), or None when nothing changed."""
    creator_id = trigger.created_by_id
    # A trigger the system made (no creator) has no departed authority to replace.
    if creator_id is None or Membership.objects.for_organization(trigger.organization_id).filter(
            user_id=creator_id).exists():
        return None
    resumer = actor.user or getattr(actor.api_key, "created_by", None)
    if resumer is None:
        return None
    before = trigger.created_by.email
    trigger.created_by = resumer
    return {"before": before, "after": resumer.email}


def pause_triggers_of_departed_member(*, actor: Actor, organization_id, user) -> int:
    """Pause every enabled trigger of ``organization_id`` created by ``user``, who has just
    been removed or left (issue 14: a trigger must not keep firing on the authority of
    someone who is gone). Each gets a ``trigger.paused`` record with reason
    ``creator_removed``, actor = ``actor`` (who removed them). Runs inside the removal's
    transaction; an owner or admin resumes a trigger (``set_enabled``) and becomes its
    creator. Returns how many triggers were paused."""
    paused = 0
    triggers = (ScheduledTrigger.objects.for_organization(organization_id).select_for_update()
                .filter(created_by_id=user.pk, enabled=True).order_by("name"))
    for trigger in triggers:
        trigger.enabled = False
        trigger.save(update_fields=["enabled"])
        audit.record("trigger.paused", actor=actor, organization=organization_id, target=trigger, metadata={
            "reason": "creator_removed", "creator": user.email,
            "changes": {"enabled": {"before": True, "after": False}}})
        paused += 1
    return paused


def set_enabled(*, actor: Actor, trigger: ScheduledTrigger, enabled: bool) -> ScheduledTrigger:
    """Pause (False) or resume (True) a trigger. Resuming does not fire missed instants
    from the paused period: the next instant is computed from now."""
    return update_trigger(actor=actor, trigger=trigger, data={"enabled": enabled})


def delete_trigger(*, actor: Actor, trigger: ScheduledTrigger) -> None:
    """Delete a trigger (its firings go with it; runs it started keep existing).

    The trigger's row is locked before the audit record is written, the order the clock
    takes them in when it fires the trigger (row, then the audit chain's lock): the other
    order deadlocked against a firing."""
    require(actor.role, Action.WORKFLOW_EDIT)
    with transaction.atomic():
        locked = ScheduledTrigger.objects.for_organization(actor.organization).select_for_update().filter(
            pk=trigger.pk).first()
        if locked is None:
            return  # deleted meanwhile
        audit.record("trigger.deleted", actor=actor, target=locked, metadata=_snapshot(locked))
        ScheduledTrigger.objects.for_organization(actor.organization).filter(pk=trigger.pk).delete()
