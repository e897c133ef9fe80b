"""REST API v1: backfills of cron triggers (engine.backfill).

GET  /triggers/<id>/backfills/preview/?start=&end=   how many runs a backfill would start (read)
GET  /triggers/<id>/backfills/                       the trigger's backfills, newest first (read)
POST /triggers/<id>/backfills/                       start one (run.operate), 201
GET  /triggers/<id>/backfills/<backfill id>/         one backfill (read)
POST /triggers/<id>/backfills/<backfill id>/cancel/  stop it (run.operate)

Views parse and authorize (api.base), read the trigger or backfill through the access
helpers (a 404 for a missing id and another organization's alike, before the body is
read), then call the service; a BackfillError is a 400 naming its field, a
BackfillConflict a 409 naming it.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from api.base import validated_query
from api.exceptions import FieldConflict
from api.pagination import page, paginate_newest_first
from api.schema import invalid, problem, problem_example
from api.serializers_backfills import (
    BOUND_HELP,
    BOUND_SCHEMA,
    BackfillCreateSerializer,
    BackfillPageSerializer,
    BackfillPreviewSerializer,
    BackfillRangeSerializer,
    BackfillSerializer,
)
from api.views_org import NOT_FOUND, TRIGGER_ID, AdminAPIView, page_parameters
from engine.access import access_backfill, access_trigger
from engine.backfill import (
    BackfillConflict,
    BackfillError,
    cancel_backfill,
    create_backfill,
    preview_backfill,
)
from engine.models import TriggerBackfill
from tenancy.models import without_credentials
from tenancy.permissions import Action

BACKFILL_ID = "6a7b8c9d-0e1f-4a2b-8c3d-4e5f6a7b8c9d"
PREVIEW_EXAMPLE = {
    "trigger": TRIGGER_ID, "timezone": "Europe/Berlin", "cron_expression": "0 6 * * *",
    "range_start": "2026-02-28T23:00:00Z", "range_end": "2026-03-31T21:59:59.999999Z", "end_cut": False,
    "instants": 31, "existing": 0, "runs": 31, "first": "2026-03-01T06:00:00+01:00",
    "last": "2026-03-31T06:00:00+02:00",
    "sample": ["2026-03-01T06:00:00+01:00", "2026-03-02T06:00:00+01:00", "2026-03-03T06:00:00+01:00",
               "2026-03-04T06:00:00+01:00", "2026-03-05T06:00:00+01:00"],
}
BACKFILL_EXAMPLE = {
    "id": BACKFILL_ID, "trigger": TRIGGER_ID, "state": "running", "range_start": "2026-02-28T23:00:00Z",
    "range_end": "2026-03-31T21:59:59.999999Z", "cron_expression": "0 6 * * *", "timezone": "Europe/Berlin",
    "max_active_runs": 10, "priority": 0, "total": 31, "created_runs": 0, "skipped": 0, "remaining": 31,
    "next_instant": "2026-03-01T05:00:00Z", "error": "", "created_by": "ada@example.com",
    "created_at": "2026-12-03T09:30:00.000000Z", "finished_at": None,
}
RANGE_INVALID = invalid(
    "A bound is not a date or a date and time, the start is after now or on a day before 1970-01-01 in the "
    "trigger's time zone, the end before the start, or the range holds more instants than "
    "FLOWFORGE_BACKFILL_MAX_RUNS (or, to start one, none: `range`); `errors` names the field.",
    {"end": ["the range holds more than 1000 instants of '*/5 * * * *' (FLOWFORGE_BACKFILL_MAX_RUNS); backfill at "
             "most 1000 at a time, with an earlier end"]})
CONFLICT = problem(409, "A backfill of this trigger is already going, the organization has its limit of backfills "
                   "going, `expect_runs` is no longer the count, or every instant of the range already has a run "
                   "(`range`: nothing to backfill; nothing is made).",
                   problem_example(409, "The request conflicts with existing data; see errors.", "conflict",
                                   errors={"trigger": ["a backfill of trigger 'nightly report' is already going; "
                                                       "cancel it or wait until it finishes"]}))


def _refusal(exc: BackfillError) -> Exception:
    """A service refusal as the problem it is: 409 for a conflict, else 400, naming the field."""
    if isinstance(exc, BackfillConflict):
        return FieldConflict({exc.field: [exc.message]})
    return serializers.ValidationError({exc.field: [exc.message]})


class _BackfillView(AdminAPIView):
    def get_scoped_queryset(self):
        return without_credentials(TriggerBackfill.objects.for_organization(self.organization), "created_by")

    def backfill(self, trigger_pk, pk) -> TriggerBackfill:
        return access_backfill(self.actor, trigger_pk, pk, shape=lambda qs: without_credentials(qs, "created_by"))


class BackfillPreviewView(_BackfillView):
    """GET /triggers/<id>/backfills/preview/?start=&end= — the count a backfill would start."""

    required_action = {"GET": Action.READ}

    @extend_schema(
        operation_id="trigger_backfills_preview",
        summary="Preview a backfill of a cron trigger",
        description="How many instants of the trigger's schedule the range holds (in the trigger's time zone, "
        "by the clock's daylight-saving rules), how many already have a run, and how many runs a backfill would "
        "start. Starts nothing.",
        parameters=[OpenApiParameter("start", BOUND_SCHEMA, required=True, description=BOUND_HELP),
                    OpenApiParameter("end", BOUND_SCHEMA, required=True, description=BOUND_HELP)],
        responses={200: BackfillPreviewSerializer, **RANGE_INVALID, **NOT_FOUND},
        examples=[OpenApiExample("march", value=PREVIEW_EXAMPLE, response_only=True)],
    )
    def get(self, request, pk):
        trigger = access_trigger(self.actor, pk)
        query = validated_query(request, BackfillRangeSerializer)
        try:
            preview = preview_backfill(actor=self.actor, trigger=trigger, start=query["start"], end=query["end"])
        except BackfillError as exc:
            raise _refusal(exc) from None
        return Response(BackfillPreviewSerializer(preview).data)


class BackfillListView(_BackfillView):
    """GET /triggers/<id>/backfills/ — the trigger's backfills, newest first (keyset pages);
    POST — start one (run.operate)."""

    required_action = {"GET": Action.READ, "POST": Action.RUN_OPERATE}

    @extend_schema(
        operation_id="trigger_backfills_list",
        summary="List a cron trigger's backfills",
        parameters=page_parameters("the creation time and id of the previous page's last backfill"),
        responses={200: BackfillPageSerializer, **NOT_FOUND},
        examples=[OpenApiExample("backfills", value={"results": [BACKFILL_EXAMPLE], "next": None},
                                 response_only=True)],
    )
    def get(self, request, pk):
        trigger = access_trigger(self.actor, pk)
        rows, next_url = paginate_newest_first(self.get_queryset().filter(trigger=trigger), request)
        return Response(page(BackfillSerializer(rows, many=True).data, next_url))

    @extend_schema(
        operation_id="trigger_backfills_create",
        summary="Backfill a cron trigger over a range",
        description="Start one run per instant of the trigger's schedule in the range (its time zone, both bounds "
        "included, cut at now), oldest first, with the trigger's input and each run's `scheduled_for` and data "
        "interval; instants that already have a run (fired by the clock or an earlier backfill) are skipped, and its "
        "`total` counts only the runs it will start; a range whose every instant already has a run is refused (409 "
        "naming `range`), so a second backfill of a range starts nothing. The runs start through the normal start path (the "
        "organization's runs-per-minute quota and the workflow's run limit apply: the backfill waits for them), "
        "at most `max_active_runs` going at once. Answers 201 at once; the backfill goes on in the background "
        "(GET it to follow).",
        request=BackfillCreateSerializer,
        responses={201: BackfillSerializer, **RANGE_INVALID, **CONFLICT, **NOT_FOUND},
        examples=[OpenApiExample("march", value={"start": "2026-03-01", "end": "2026-03-31", "expect_runs": 31},
                                 request_only=True),
                  OpenApiExample("started", value=BACKFILL_EXAMPLE, response_only=True, status_codes=["201"])],
    )
    def post(self, request, pk):
        trigger = access_trigger(self.actor, pk)
        payload = BackfillCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        try:
            backfill = create_backfill(actor=self.actor, trigger=trigger, start=data["start"], end=data["end"],
                                       max_active_runs=data.get("max_active_runs"), priority=data.get("priority"),
                                       expect_runs=data.get("expect_runs"))
        except BackfillError as exc:
            raise _refusal(exc) from None
        return Response(BackfillSerializer(self.backfill(trigger.pk, backfill.pk)).data,
                        status=status.HTTP_201_CREATED)


class BackfillDetailView(_BackfillView):
    """GET /triggers/<id>/backfills/<backfill id>/ — one backfill, its progress."""

    required_action = {"GET": Action.READ}

    @extend_schema(operation_id="trigger_backfills_retrieve", summary="Get a backfill",
                   responses={200: BackfillSerializer, **NOT_FOUND},
                   examples=[OpenApiExample("backfill", value=BACKFILL_EXAMPLE, response_only=True)])
    def get(self, request, pk, backfill_pk):
        return Response(BackfillSerializer(self.backfill(pk, backfill_pk)).data)


class BackfillCancelView(_BackfillView):
    """POST /triggers/<id>/backfills/<backfill id>/cancel/ — stop a backfill (idempotent;
    the runs it started go on)."""

    required_action = {"POST": Action.RUN_OPERATE}

    @extend_schema(operation_id="trigger_backfills_cancel", summary="Cancel a backfill", request=None,
                   responses={200: BackfillSerializer, **NOT_FOUND},
                   examples=[OpenApiExample("cancelled", value={**BACKFILL_EXAMPLE, "state": "cancelled",
                                                                "next_instant": None, "remaining": 0},
                                            response_only=True)])
    def post(self, request, pk, backfill_pk):
        cancel_backfill(actor=self.actor, backfill=self.backfill(pk, backfill_pk))
        return Response(BackfillSerializer(self.backfill(pk, backfill_pk)).data)
