"""Staff's view of the engine: runs, the outbox (dead letters included) and the notifications'
outbox (deliveries; never an endpoint's URL or secret). Read-only: state changes go through
engine/repositories/, never through a form."""

from __future__ import annotations

from django.contrib import admin

from engine.models import NotificationDelivery, OutboxMessage, WorkflowRun


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

    def get_queryset(self, request):
        return WorkflowRun.objects.unscoped().select_related("organization", "workflow")


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
