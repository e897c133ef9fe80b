"""Staff's view of the engine: runs, the outbox (dead letters included) and the notifications'
outbox (deliveries; never an endpoint's URL or secret). Read-only: state changes go through
engine/repositories/, never through a form."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.template.response import TemplateResponse
from django.urls import path

from engine import partitions, retention, sql
from engine.models import NotificationDelivery, OutboxMessage, WorkflowRun

#: Organizations the history page lists (by slug); the purge preview has them all.
HISTORY_PAGE_ORGANIZATIONS = 500


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "organization", "workflow", "state", "trigger_source", "created_at", "finished_at")
    list_filter = ("state", "trigger_source")
    search_fields = ("id",)
    list_select_related = ("organization", "workflow")
    show_full_result_count = False

    change_list_template = "admin/engine/workflowrun/change_list.html"

    def get_queryset(self, request):
        return WorkflowRun.objects.unscoped().select_related("organization", "workflow")

    def get_urls(self):
        return [
            path("history/", self.admin_site.admin_view(self.history_view), name="engine_workflowrun_history"),
        ] + super().get_urls()

    def history_view(self, request):
        """Staff's "History storage" page (issue 21; docs/retention.md): the history tables'
        sizes, their partitions (how many, how many ahead, the oldest), the drop horizon, and
        per organization its retention, its oldest run kept, its runs past retention and the
        purge's lag. Read from the catalog and one index probe per organization."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        now = dt.datetime.now(dt.UTC)
        with connection.cursor() as cur:
            cur.execute(sql.queries["metrics_table_sizes"])
            sizes = cur.fetchall()
            cur.execute(sql.queries["run_oldest_per_org"], {"limit": HISTORY_PAGE_ORGANIZATIONS})
            orgs = cur.fetchall()
        parts = partitions.partitions()
        backlog = {b.organization_id: b for b in retention.backlog()}
        default = float(settings.FLOWFORGE_RUN_RETENTION_SECONDS)
        rows = []
        for org_id, slug, days, oldest in orgs:
            seconds = days * 86400 if days is not None else default
            late = backlog.get(str(org_id))
            lag = now - late.oldest - dt.timedelta(seconds=seconds) if late else None
            rows.append({"slug": slug, "oldest": oldest, "backlog": late.runs if late else 0,
                         "retention": retention.describe(seconds) if seconds else "forever",
                         "lag": str(lag).split(".")[0] if lag and lag.total_seconds() > 0 else ""})
        context = {
            **self.admin_site.each_context(request),
            "title": "History storage",
            "opts": self.model._meta,
            "sizes": sizes,
            "partitions": [{"parent": parent, "total": len(mine), "ahead": sum(p.hi > now for p in mine),
                            "oldest": min(p.lo for p in mine)}
                           for parent in partitions.PARENTS if (mine := [p for p in parts if p.parent == parent])],
            "horizon": partitions.drop_horizon(),
            "period": retention.describe(partitions.period_seconds()),
            "ahead_wanted": settings.FLOWFORGE_HISTORY_PARTITIONS_AHEAD,
            "default_retention": retention.describe(default) if default else "forever",
            "organizations": rows,
        }
        return TemplateResponse(request, "admin/engine/history.html", context)


class DeadLetterFilter(admin.SimpleListFilter):
    title = "delivery"
    parameter_name = "delivery"

    def lookups(self, request, model_admin):
        return [("pending", "pending"), ("published", "published"), ("dead", "dead-lettered")]

    def queryset(self, request, queryset):
        if self.value() == "pending":
            return queryset.filter(published_at__isnull=True, dead_lettered_at__isnull=True)
        if self.value() == "published":
            return queryset.filter(published_at__isnull=False)
        if self.value() == "dead":
            return queryset.filter(dead_lettered_at__isnull=False)
        return queryset


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("id", "organization", "task_run", "fencing_token_snapshot", "publish_attempts",
                    "published_at", "dead_lettered_at", "last_error", "created_at")
    list_filter = (DeadLetterFilter,)
    search_fields = ("id", "task_run__id")
    show_full_result_count = False

    def get_queryset(self, request):
        return OutboxMessage.objects.unscoped().select_related("organization")


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ReadOnlyAdmin):
    """Deliveries of every organization (issue 19): state, attempts, the last answer; the
    endpoint is named by its id only (its URL may hold a receiver's token)."""

    list_display = ("id", "organization", "channel", "endpoint_id", "state", "attempts", "last_status",
                    "next_attempt_at", "dead_lettered_at", "created_at")
    list_filter = ("state", "channel")
    search_fields = ("id", "event__id")
    fields = ("id", "organization", "channel", "endpoint_id", "event_id", "replay_of_id", "state", "attempts",
              "claim_token", "next_attempt_at", "lease_expires_at", "last_status", "last_error", "delivered_at",
              "dead_lettered_at", "created_at")
    readonly_fields = fields
    show_full_result_count = False

    def get_queryset(self, request):
        return NotificationDelivery.objects.unscoped().select_related("organization")
