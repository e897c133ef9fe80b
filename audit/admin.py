"""Staff's view of the audit log: strictly read-only, filterable, searchable, exportable."""

from __future__ import annotations

import csv

from django.contrib import admin
from django.contrib.admin.options import ActionLocation
from django.http import HttpRequest, StreamingHttpResponse
from django.urls import path

from audit.models import AuditCheckpoint, AuditLog

EXPORT_COLUMNS = (
    "created_at", "organization_id", "actor_type", "actor_email", "actor_api_key_prefix", "action",
    "target_type", "target_id", "metadata", "ip_address", "user_agent", "request_id", "chain", "seq", "row_hash",
)
# A spreadsheet reads a cell starting with one of these as a formula (OWASP "CSV
# Injection"): ``=HYPERLINK(...)`` from a user agent would become a live link in staff's
# spreadsheet. Such a cell is written with a leading single quote, which makes it text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value) -> str:
    """``value`` as the text of one CSV cell that no spreadsheet evaluates: None is
    empty, anything else its ``str()``, prefixed with ``'`` when it starts with
    ``= + - @``, a tab or a carriage return (FORMULA_STARTS)."""
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class _Echo:
    def write(self, value):
        return value


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):
    """No add, change or delete permission for anyone, superusers included."""

    list_display = ("created_at", "organization", "actor_type", "actor_email", "action", "target_type", "target_id", "request_id")
    list_filter = ("organization", "action", "actor_type", ("created_at", admin.DateFieldListFilter))
    search_fields = ("actor_email", "target_id", "request_id")
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-id")
    list_select_related = ("organization",)
    readonly_fields = [f.name for f in AuditLog._meta.fields]
    show_full_result_count = False
    change_list_template = "admin/audit/auditlog/change_list.html"

    def get_queryset(self, request):
        # Staff audit across organizations: an explicit, reviewed cross-tenant read.
        return AuditLog.objects.unscoped().select_related("organization")

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_actions(self, request, action_location=ActionLocation.CHANGE_LIST):
        return {}  # no bulk actions, so no bulk delete

    def get_urls(self):
        return [
            path("export.csv", self.admin_site.admin_view(self.export_csv), name="audit_auditlog_export"),
        ] + super().get_urls()

    def export_csv(self, request: HttpRequest):
        """The changelist's current filter and search, as CSV (streamed); cells a
        spreadsheet would evaluate are neutralized (``spreadsheet_safe``)."""
        if not self.has_view_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        changelist = self.get_changelist_instance(request)
        rows = changelist.get_queryset(request).order_by("-created_at", "-id").values_list(*EXPORT_COLUMNS)
        writer = csv.writer(_Echo())

        def stream():
            yield writer.writerow(EXPORT_COLUMNS)
            for row in rows.iterator(chunk_size=2000):
                # Every cell: a user agent, an email, a target id or metadata may be the caller's text.
                yield writer.writerow([spreadsheet_safe(value) for value in row])

        response = StreamingHttpResponse(stream(), content_type="text/csv")
        response["Content-Disposition"] = 'attachment; filename="audit-log.csv"'
        return response


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(admin.ModelAdmin):
    """Where each chain starts after audit retention (audit.retention): read-only."""

    list_display = ("created_at", "chain", "seq", "rows_removed", "row_created_at", "key_id")
    search_fields = ("chain",)
    ordering = ("-created_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
