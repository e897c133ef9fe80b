"""Forms of the workflow, trigger, API-key and settings pages, and the plain-English
description of a cron expression shown beside the trigger form.

The forms parse input only (JSON, dates, which file); the rules live in the services
(engine.services, engine.triggers, tenancy.apikeys, tenancy.services), whose errors
the views put back on the field they name.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any
from zoneinfo import available_timezones

from django import forms
from django.utils import timezone

from engine.definitions import DefinitionError, parse_document
from engine.models import CatchUpPolicy, WorkflowState
from frontend.forms import RoleField
from tenancy.models import ROLE_RANK, Role

# Largest definition file accepted from the upload field, in bytes.
MAX_DEFINITION_BYTES = 2 * 1024 * 1024


def offered_key_roles(actor_role: str | None) -> list[tuple[str, str]]:
    """The roles a key created by ``actor_role`` may have: that role and the ones below."""
    rank = ROLE_RANK.get(actor_role, -1)
    return [(value, label) for value, label in Role.choices if ROLE_RANK[value] <= rank]


def parse_json_object(text: str, *, what: str = "Input") -> dict[str, Any]:
    """``text`` as a JSON object ({} when blank). Raises ValidationError saying where
    the JSON is broken, or that it is not an object."""
    text = (text or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"{what} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}."
        ) from None
    except RecursionError:
        raise forms.ValidationError(f"{what} is nested too deeply.") from None
    if not isinstance(value, dict):
        raise forms.ValidationError(f'{what} must be a JSON object, such as {{"limit": 10}}.')
    return value


class JsonObjectField(forms.CharField):
    """A textarea holding a JSON object; cleans to a dict. The page's json-input.js
    checks it in the browser too (``data-json-object``)."""

    def __init__(self, *, what: str = "Input", **kwargs: Any) -> None:
        self.what = what
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "widget",
            forms.Textarea(
                attrs={
                    "rows": 5,
                    "spellcheck": "false",
                    "class": "mono",
                    "data-json-object": "",
                    "autocomplete": "off",
                }
            ),
        )
        super().__init__(**kwargs)

    def clean(self, value: Any) -> dict[str, Any]:
        return parse_json_object(super().clean(value), what=self.what)


# --- workflows ----------------------------------------------------------------------------------


class DefinitionForm(forms.Form):
    """A workflow definition, pasted or uploaded (JSON or YAML)."""

    definition = forms.CharField(
        required=False,
        label="Definition",
        widget=forms.Textarea(
            attrs={"rows": 18, "spellcheck": "false", "class": "mono", "autocomplete": "off"}
        ),
        help_text="JSON or YAML: a name and a list of tasks.",
    )
    file = forms.FileField(required=False, label="Or upload a file", help_text=".json, .yaml or .yml")
    state = forms.ChoiceField(
        choices=[
            (WorkflowState.ACTIVE, "Active: runs can start at once"),
            (WorkflowState.DRAFT, "Draft: activate it later"),
        ],
        initial=WorkflowState.ACTIVE,
        label="Save as",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # [{path, message}] of the last parse or validation; shown as a list by the field.
        self.definition_errors: list[dict[str, str]] = []
        self.source_field = "definition"

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        upload = data.get("file")
        text = data.get("definition") or ""
        filename = ""
        if upload:
            self.source_field = "file"
            if upload.size > MAX_DEFINITION_BYTES:
                self.add_error("file", f"The file is {upload.size} bytes; at most {MAX_DEFINITION_BYTES}.")
                return data
            try:
                text = upload.read().decode("utf-8-sig")
            except UnicodeDecodeError:
                self.add_error("file", "The file is not UTF-8 text.")
                return data
            filename = upload.name or ""
        if not text.strip():
            self.add_error("definition", "Paste a definition or choose a file.")
            return data
        try:
            data["document"] = parse_document(text, filename=filename.lower())
        except DefinitionError as exc:
            self.set_definition_errors(exc.errors)
        return data

    def set_definition_errors(self, errors: list[dict[str, str]]) -> None:
        """Put a DefinitionError's problems on the field the definition came from."""
        self.definition_errors = list(errors)
        self.add_error(
            self.source_field, f"The definition has {len(errors)} problem{'s' if len(errors) != 1 else ''}."
        )


class StartRunForm(forms.Form):
    input = JsonObjectField(label="Run input (JSON object)", what="Run input", initial="{}")


class ArchiveForm(forms.Form):
    confirm = forms.CharField(
        required=False,
        label="Type the workflow's name to confirm",
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )


# --- triggers -----------------------------------------------------------------------------------


def timezone_choices() -> list[tuple[str, str]]:
    zones = sorted(z for z in available_timezones() if "/" in z and not z.startswith(("Etc/", "SystemV/")))
    return [("UTC", "UTC"), *((z, z.replace("_", " ")) for z in zones)]


class TriggerForm(forms.Form):
    name = forms.CharField(max_length=200)
    workflow_name = forms.ChoiceField(
        label="Workflow", help_text="Each firing runs its latest active version."
    )
    cron_expression = forms.CharField(
        label="Schedule (cron)",
        max_length=200,
        widget=forms.TextInput(
            attrs={
                "class": "mono",
                "placeholder": "*/15 * * * *",
                "autocomplete": "off",
                "spellcheck": "false",
            }
        ),
        help_text="Five fields: minute, hour, day of month, month, day of week.",
    )
    timezone = forms.ChoiceField(label="Time zone", initial="UTC")
    input = JsonObjectField(label="Run input (JSON object)", what="Run input", initial="{}")
    catch_up = forms.ChoiceField(
        label="Missed firings",
        choices=[
            (CatchUpPolicy.LATEST, "Run the most recent one once"),
            (CatchUpPolicy.SKIP, "Skip them"),
            (CatchUpPolicy.ALL, "Run each of them"),
        ],
        initial=CatchUpPolicy.LATEST,
        help_text="What happens to firings missed while the scheduler was down.",
    )
    enabled = forms.BooleanField(required=False, initial=True, label="Enabled")

    def __init__(self, *args: Any, workflow_names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["workflow_name"].choices = [(n, n) for n in workflow_names]
        self.fields["timezone"].choices = timezone_choices()
        self.fields["cron_expression"].widget.attrs["aria-describedby"] = "cron-preview"

    def service_data(self) -> dict[str, Any]:
        """The cleaned fields in the shape engine.triggers expects."""
        d = self.cleaned_data
        return {
            "name": d["name"],
            "workflow_name": d["workflow_name"],
            "cron_expression": d["cron_expression"],
            "timezone": d["timezone"],
            "input": d["input"],
            "catch_up": d["catch_up"],
            "enabled": bool(d["enabled"]),
        }


# --- API keys and settings ----------------------------------------------------------------------


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Say where it is used, e.g. “CI deploys”.")
    role = RoleField(initial=Role.MEMBER, help_text="The key never acts above its creator's current role.")
    expires_on = forms.DateField(
        required=False,
        label="Expires on (UTC)",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="The key stops working at 00:00 UTC that day. Leave empty for no expiry.",
    )

    def __init__(self, *args: Any, actor_role: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["role"].widget.choices = offered_key_roles(actor_role)

    def clean_name(self) -> str:
        return self.cleaned_data["name"].strip()

    def clean_expires_on(self) -> dt.date | None:
        day = self.cleaned_data.get("expires_on")
        if day is not None and day <= timezone.now().astimezone(dt.UTC).date():
            raise forms.ValidationError("Choose a date after today.")
        return day

    @property
    def expires_at(self) -> dt.datetime | None:
        day = self.cleaned_data.get("expires_on")
        return None if day is None else dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)


class OrganizationSettingsForm(forms.Form):
    name = forms.CharField(max_length=200, help_text="Shown in the header and in invitations.")

    def clean_name(self) -> str:
        return self.cleaned_data["name"].strip()


# --- cron in words ------------------------------------------------------------------------------

_WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_DOW_NAMES = {d[:3].lower(): i for i, d in enumerate(_WEEKDAYS)}
_MONTH_NAMES = {m[:3].lower(): i + 1 for i, m in enumerate(_MONTHS)}


class _Unsupported(Exception):
    """A field this describer does not put into words (the fallback takes over)."""


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _value(token: str, names: dict[str, int] | None = None) -> int:
    if token.isdigit():
        return int(token)
    if names and token.lower() in names:
        return names[token.lower()]
    raise _Unsupported(token)


def _items(field: str, names: dict[str, int] | None = None) -> list[tuple[int, int]]:
    """A list field ("1,3-5") as (first, last) ranges; steps are not handled here."""
    out = []
    for part in field.split(","):
        if "/" in part or part in ("*", "?") or not part:
            raise _Unsupported(field)
        if "-" in part:
            a, b = part.split("-", 1)
            out.append((_value(a, names), _value(b, names)))
        else:
            v = _value(part, names)
            out.append((v, v))
    return out


def _step(field: str) -> int | None:
    """N for "*/N", else None."""
    if field.startswith("*/") and field[2:].isdigit() and int(field[2:]) > 0:
        return int(field[2:])
    return None


def _days(dom: str, month: str, dow: str) -> str:
    parts = []
    if dom not in ("*", "?"):
        if dom.upper() == "L":
            parts.append("on the last day of the month")
        else:
            ranges = _items(dom)
            words = [f"{a}" if a == b else f"{a} to {b}" for a, b in ranges]
            single = len(ranges) == 1 and ranges[0][0] == ranges[0][1]
            parts.append(f"on day{'' if single else 's'} {_and(words)} of the month")
    if dow not in ("*", "?"):
        # 0 and 7 are both Sunday.
        ranges = [(a % 7, a % 7) if a == b else (a % 7, b) for a, b in _items(dow, _DOW_NAMES)]
        words = []
        for a, b in ranges:
            if a == b:
                words.append(_WEEKDAYS[a])
            else:
                words.append(f"{_WEEKDAYS[a]} through {_WEEKDAYS[b % 7]}")
        text = "on " + _and(words)
        parts.append(("or " if parts else "") + text)  # cron: either day field matches
    if month != "*":
        ranges = _items(month, _MONTH_NAMES)
        if not all(1 <= a <= 12 and 1 <= b <= 12 for a, b in ranges):
            raise _Unsupported(month)
        words = [
            _MONTHS[a - 1] if a == b else f"{_MONTHS[a - 1]} through {_MONTHS[b - 1]}" for a, b in ranges
        ]
        parts.append("in " + _and(words))
    return " ".join(parts) if parts else "every day"


def _times(minute: str, hour: str) -> str:
    m_step, h_step = _step(minute), _step(hour)
    if minute == "*" and hour == "*":
        return "Every minute"
    if m_step and hour == "*":
        return "Every minute" if m_step == 1 else f"Every {m_step} minutes"
    if minute.isdigit() and hour == "*":
        return "Every hour, on the hour" if int(minute) == 0 else f"Every hour at {int(minute)} minutes past"
    if minute.isdigit() and h_step:
        at = "on the hour" if int(minute) == 0 else f"at {int(minute)} minutes past"
        return f"Every {h_step} hours, {at}" if h_step > 1 else f"Every hour, {at}"
    if minute == "*" or m_step:
        every = "Every minute" if minute == "*" or m_step == 1 else f"Every {m_step} minutes"
        hours = _items(hour)
        spans = [f"{a:02d}:00 through {b:02d}:59" for a, b in hours]
        return f"{every}, {_and(spans)}"
    hour_ranges = _items(hour)
    if minute.isdigit() and len(hour_ranges) == 1 and hour_ranges[0][0] < hour_ranges[0][1]:
        (a, b), m = hour_ranges[0], int(minute)
        return f"Every hour from {a:02d}:{m:02d} through {b:02d}:{m:02d}"
    minutes = [m for a, b in _items(minute) for m in range(a, b + 1)]
    hours = [h for a, b in hour_ranges for h in range(a, b + 1)]
    if not all(0 <= m <= 59 for m in minutes) or not all(0 <= h <= 23 for h in hours):
        raise _Unsupported(minute + " " + hour)
    times = sorted(f"{h:02d}:{m:02d}" for h in hours for m in minutes)
    if len(times) > 6:
        raise _Unsupported(minute + " " + hour)
    return "At " + _and(times)


def describe_cron(expression: str) -> str:
    """``expression`` (five cron fields) in plain English, e.g. "At 09:30 on Monday
    through Friday" for ``30 9 * * 1-5``; times are in the trigger's own zone.

    Common patterns are put into words here; for anything else the cron-descriptor
    library is used when it is installed, and otherwise the fields are named one by
    one. Returns "" for text that is not five fields (the service reports that).
    """
    fields = (expression or "").split()
    if len(fields) != 5:
        return ""
    minute, hour, dom, month, dow = fields
    try:
        times = _times(minute, hour)
        days = _days(dom, month, dow)
    except (_Unsupported, IndexError, ValueError):
        pass
    else:
        if times.startswith("At "):
            return f"{times} {days}"
        return times if days == "every day" else f"{times}, {days}"
    try:  # optional: pip install cron-descriptor
        from cron_descriptor import get_description  # type: ignore[import-not-found]

        return str(get_description(" ".join(fields)))
    except Exception:  # not installed, or it refused the expression
        pass
    return f"Minute {minute}, hour {hour}, day of month {dom}, month {month}, day of week {dow}"
