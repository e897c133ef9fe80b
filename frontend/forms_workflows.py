"""Forms of the workflow, trigger, API-key and settings pages, and the plain-English
description of a cron expression shown beside the trigger form.

The forms parse input only (JSON, dates, which file); the rules live in the services
(engine.services, engine.triggers, tenancy.apikeys, tenancy.services), whose errors
the views put back on the field they name.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any
from zoneinfo import available_timezones

from django import forms
from django.utils import timezone

from engine.definitions import DefinitionError, parse_document
from engine.models import CatchUpPolicy, WorkflowState
from engine.states import PRIORITY_MAX, PRIORITY_MIN, priority_problem
from tenancy.models import KEY_ROLE_RANK, ROLE_RANK, KeyRole, Role

# Largest definition file accepted from the upload field, in bytes.
MAX_DEFINITION_BYTES = 2 * 1024 * 1024


def offered_key_roles(actor_role: str | None) -> list[tuple[str, str]]:
    """The roles a key created by ``actor_role`` may have: that role and the ones below,
    and ``worker`` (a key of the organization's own worker processes)."""
    rank = ROLE_RANK.get(actor_role, -1)
    if rank < 0:
        return []
    return [(value, label) for value, label in KeyRole.choices if KEY_ROLE_RANK[value] <= rank]


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


class WholeNumberField(forms.IntegerField):
    """Digits with an optional sign only: Django's IntegerField also takes ``2.0`` (and
    "2.000"), which the API, the definitions and the services refuse as not a whole
    number; one rule everywhere."""

    _WHOLE = re.compile(r"[+-]?[0-9]+\Z")

    def to_python(self, value: Any) -> int | None:
        if isinstance(value, str) and value.strip() and not self._WHOLE.match(value.strip()):
            raise forms.ValidationError("Enter a whole number (no decimal point).", code="invalid")
        return super().to_python(value)


class PriorityField(WholeNumberField):
    """A run's or a trigger's priority: blank for 0, else a whole number from PRIORITY_MIN
    to PRIORITY_MAX, refused in ``engine.states.priority_problem``'s words (the API's, a
    definition's), e.g. "Must be a whole number from -10 to 10, got 11." The input box
    carries the range as its min and max."""

    def __init__(self, *, help_text: str, **kwargs: Any) -> None:
        super().__init__(initial=0, required=False, label="Priority", help_text=help_text, **kwargs)

    def widget_attrs(self, widget: forms.Widget) -> dict[str, Any]:
        return {**super().widget_attrs(widget), "min": PRIORITY_MIN, "max": PRIORITY_MAX}

    def to_python(self, value: Any) -> int | None:
        if isinstance(value, str) and not value.strip():
            return None  # blank, spaces too: 0
        try:
            return super().to_python(value)
        except forms.ValidationError:
            raise forms.ValidationError(self._problem(value), code="invalid") from None

    def validate(self, value: Any) -> None:
        super().validate(value)
        if value is not None and priority_problem(value) is not None:
            raise forms.ValidationError(self._problem(value), code="out_of_range")

    @staticmethod
    def _problem(value: Any) -> str:
        if isinstance(value, str):
            value = value.strip()
            value = value if len(value) <= 20 else value[:20] + "…"  # echoed: a field may hold anything
        problem = priority_problem(value) or ""
        return problem[:1].upper() + problem[1:] + "."


class StartRunForm(forms.Form):
    input = JsonObjectField(label="Run input (JSON object)", what="Run input", initial="{}")
    priority = PriorityField(help_text="-10 to 10: higher runs first within the organization's share.")


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
    priority = PriorityField(
        help_text="Of the runs it starts, -10 to 10: higher runs first within the organization's share.",
    )

    def __init__(self, *args: Any, workflow_names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["workflow_name"].choices = [(n, n) for n in workflow_names]
        self.fields["timezone"].choices = timezone_choices()
        self.fields["cron_expression"].widget.attrs["aria-describedby"] = "cron-preview"
        # The live preview speaks for the schedule as it is typed: editing it hides the server's
        # error under it, which is about the text sent before (workflows.js, data-live-preview).
        self.fields["cron_expression"].widget.attrs["data-live-preview"] = "cron-preview"

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
            "priority": d.get("priority") or 0,
        }


# --- API keys and settings ----------------------------------------------------------------------


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Say where it is used, e.g. “CI deploys”.")
    role = forms.ChoiceField(
        choices=KeyRole.choices, initial=Role.MEMBER,
        help_text="The key never acts above its creator's current role. A worker key can only serve "
        "worker tasks to your own worker processes (docs/workers.md).")
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


# --- secrets -------------------------------------------------------------------------------------


class SecretValueInput(forms.Textarea):
    """A textarea that never renders a value back: a form sent back with errors (or
    shown again) must not put the secret into the page."""

    def format_value(self, value: Any) -> None:
        return None


def _secret_value_field() -> forms.CharField:
    return forms.CharField(
        strip=False,  # the value as typed: a trailing space or newline may be part of it
        widget=SecretValueInput(attrs={"rows": 3, "autocomplete": "off", "spellcheck": "false",
                                       "class": "mono"}),
        help_text="Stored encrypted and never shown again, to anyone. At least 4 characters.",
    )


class SecretCreateForm(forms.Form):
    """Create a secret: its name and value (tenancy.vault checks both again)."""

    name = forms.CharField(max_length=64, help_text="Letters, digits and _, not starting with a digit. "
                           "Tasks reference it as {{ secrets.NAME }}.")
    value = _secret_value_field()

    def clean_name(self) -> str:
        return self.cleaned_data["name"].strip()


class SecretRotateForm(forms.Form):
    """Replace a secret's value (its version goes up by one)."""

    value = _secret_value_field()


# --- backfills of cron triggers -----------------------------------------------------------------


class BackfillForm(forms.Form):
    """The range of a backfill (engine.backfill reads the bounds in the trigger's zone and
    names the field it refuses) and how many of its runs may go at once."""

    start = forms.CharField(
        max_length=64, label="From",
        widget=forms.TextInput(attrs={"placeholder": "2026-03-01", "autocomplete": "off", "class": "mono"}),
        help_text="A day (2026-03-01) or a day and time (2026-03-01T06:00), in the trigger's time zone.")
    end = forms.CharField(
        max_length=64, label="To (included)",
        widget=forms.TextInput(attrs={"placeholder": "2026-03-31", "autocomplete": "off", "class": "mono"}),
        help_text="A day is included whole; a range ending after now stops at now.")
    max_active_runs = WholeNumberField(
        min_value=1, max_value=100, initial=10, required=False, label="Runs at once",
        help_text="How many of its runs may be going at once (1: one after the other, in order).")
