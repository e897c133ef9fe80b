"""Serializers of cron triggers' backfills (API v1): the input of a preview and of a
backfill, a preview, and a backfill.

The range's bounds are strings (a date, or an ISO 8601 date and time) that the service
(engine.backfill.parse_bound) reads in the trigger's time zone; these serializers only
check types, so every rule and its message stays the service's.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from api.serializers import RejectUnknownFields, StrictPriorityField, page_of
from api.serializers_org import TextField
from engine.backfill import BACKFILL_MAX_ACTIVE_RUNS, DEFAULT_MAX_ACTIVE_RUNS, PREVIEW_SAMPLE
from engine.models import TriggerBackfill

# The forms engine.backfill.parse_bound reads (documented so that generated requests try them;
# the service judges each value and names the field it refuses).
BOUND_PATTERN = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?)?$"
BOUND_SCHEMA = {"type": "string", "maxLength": 64, "pattern": BOUND_PATTERN}
BOUND_HELP = ("A date (2026-03-01: the whole day, in the trigger's time zone) or an ISO 8601 date and time "
              "(2026-03-01T06:00 in the trigger's zone, or with an offset / Z); both bounds are included.")


@extend_schema_field({"type": "string", "format": "date-time", "nullable": True})
class ZonedInstantField(serializers.Field):
    """An aware datetime shown with its own UTC offset (the trigger's zone), not converted
    to the site's zone as DRF's DateTimeField would."""

    def to_representation(self, value):
        return value.isoformat() if value is not None else None


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: "3", 2.0 and true are refused, not converted."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field({**BOUND_SCHEMA, "description": BOUND_HELP})
class BoundField(TextField):
    """A range bound: a string, read by the service (engine.backfill.parse_bound)."""


class BackfillRangeSerializer(serializers.Serializer):
    """Query of GET /triggers/<id>/backfills/preview/: the range."""

    start = BoundField(max_length=64, help_text=BOUND_HELP)
    end = BoundField(max_length=64, help_text=BOUND_HELP)


class BackfillCreateSerializer(RejectUnknownFields, BackfillRangeSerializer):
    """Body of POST /triggers/<id>/backfills/."""

    max_active_runs = StrictIntegerField(
        required=False, min_value=1, max_value=BACKFILL_MAX_ACTIVE_RUNS,
        help_text=f"How many of its runs may be going at once, 1 to {BACKFILL_MAX_ACTIVE_RUNS} (default "
        f"{DEFAULT_MAX_ACTIVE_RUNS}; 1 runs the instants strictly one after the other).")
    priority = StrictPriorityField(required=False,
                                   help_text="Its runs' priority, -10 to 10 (default: the trigger's).")
    expect_runs = StrictIntegerField(
        required=False, min_value=0,
        help_text="The run count a preview showed: the backfill is refused (409) if the range now has another.")


class BackfillPreviewSerializer(serializers.Serializer):
    """What a backfill of the range would start (engine.backfill.BackfillPreview)."""

    trigger = serializers.UUIDField(source="trigger.pk")
    timezone = serializers.CharField(source="trigger.timezone")
    cron_expression = serializers.CharField(source="trigger.cron_expression")
    range_start = serializers.DateTimeField(help_text="The range's first instant (UTC).")
    range_end = serializers.DateTimeField(help_text="The range's last instant (UTC; cut at now).")
    end_cut = serializers.BooleanField(help_text="The range asked for ended after now; it was cut there.")
    instants = serializers.IntegerField(help_text="Instants of the schedule in the range.")
    existing = serializers.IntegerField(help_text="Of those, instants that already have a run.")
    runs = serializers.IntegerField(help_text="Runs the backfill would start: instants - existing.")
    first = ZonedInstantField(allow_null=True, help_text="The first instant, in the trigger's zone.")
    last = ZonedInstantField(allow_null=True, help_text="The last instant, in the trigger's zone.")
    sample = serializers.ListField(child=ZonedInstantField(), max_length=PREVIEW_SAMPLE,
                                   help_text=f"The first {PREVIEW_SAMPLE} instants, in the trigger's zone.")


class BackfillSerializer(serializers.ModelSerializer):
    """A backfill of a cron trigger. ``total`` runs it set out to start: the instants in
    [range_start, range_end] (UTC, both included) that had no run when it was made;
    ``created_runs`` runs it started; ``skipped`` instants it passed because they had a
    run; ``remaining`` runs it has still to start; ``next_instant`` the next instant it
    will look at (null once finished); ``error`` why it failed. Expects ``created_by``
    selected."""

    trigger = serializers.UUIDField(source="trigger_id", read_only=True)
    remaining = serializers.SerializerMethodField()
    created_by = serializers.SerializerMethodField()

    class Meta:
        model = TriggerBackfill
        fields = ["id", "trigger", "state", "range_start", "range_end", "cron_expression", "timezone",
                  "max_active_runs", "priority", "total", "created_runs", "skipped", "remaining", "next_instant",
                  "error", "created_by", "created_at", "finished_at"]
        read_only_fields = fields

    def get_remaining(self, backfill) -> int:
        """Runs it has still to start (0 once finished; an instant the clock fires meanwhile
        is one fewer when the backfill passes it)."""
        if backfill.state != "running":
            return 0
        return max(0, backfill.total - backfill.created_runs)

    def get_created_by(self, backfill) -> str | None:
        return backfill.created_by.email if backfill.created_by_id else None


BackfillPageSerializer = page_of(BackfillSerializer, "BackfillPageSerializer")
