"""Staff administration of people and organizations. Every change made here is
recorded in the audit log (audit.signals records each admin LogEntry); a change of an
organization's plan or limits records each value before and after in it."""

from __future__ import annotations

import json

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.core.validators import MaxValueValidator, MinValueValidator
from django.forms.models import BaseInlineFormSet

from tenancy.limits import LIMIT_NAMES, plans
from tenancy.models import ApiKey, Membership, Organization, User
from tenancy.services import TenancyError, organization_name, organization_slug

# An override's bounds (the CHECK constraints of core_organization: org_weight_range,
# org_max_running_positive, org_max_runs_per_minute_positive, org_max_definition_bytes_positive).
OVERRIDE_BOUNDS = {"weight": (1, 100), "max_running_task_runs": (1, None), "max_runs_per_minute": (1, None),
                   "max_definition_bytes": (1, None)}
LIMIT_FIELDS = ("plan", *(f"{name}_override" for name in LIMIT_NAMES))


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    ordering = ("email",)
    list_display = ("email", "name", "is_staff", "is_active", "date_joined")
    search_fields = ("email", "name")
    fieldsets = (
        (None, {"fields": ("email", "password")}),
        ("Profile", {"fields": ("name",)}),
        ("Permissions", {"fields": ("is_active", "is_staff", "is_superuser", "groups", "user_permissions")}),
        ("Dates", {"fields": ("last_login", "date_joined")}),
    )
    add_fieldsets = ((None, {"classes": ("wide",), "fields": ("email", "password1", "password2")}),)


class _MembershipFormSet(BaseInlineFormSet):
    def add_fields(self, form, index):
        super().add_fields(form, index)
        # The row id's choices: Django builds them from the default (scoped) manager, which
        # refuses an unscoped query, so saving an organization with members failed.
        pk = form.fields.get(self.model._meta.pk.name)
        if pk is not None and hasattr(pk, "queryset"):
            pk.queryset = Membership.objects.unscoped()  # staff: an explicit cross-tenant read


class MembershipInline(admin.TabularInline):
    model = Membership
    formset = _MembershipFormSet
    extra = 0
    raw_id_fields = ("user",)
    # The split date-time widget drops microseconds: editable, every save "changed" it.
    readonly_fields = ("created_at",)

    def get_queryset(self, request):
        # Staff see every organization: an explicit, reviewed cross-tenant read.
        return Membership.objects.unscoped().select_related("user")


class OrganizationAdminForm(forms.ModelForm):
    """The organization's change form: each ``*_override`` validated against its column's
    bounds, with help text naming every plan's default (settings.FLOWFORGE_PLANS); empty
    means "the plan's"."""

    class Meta:
        model = Organization
        fields = ("name", "slug", *LIMIT_FIELDS, "run_retention_days")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        table = plans()
        for name in LIMIT_NAMES:
            field = self.fields.get(f"{name}_override")
            if field is None:
                continue
            low, high = OVERRIDE_BOUNDS[name]
            field.validators.append(MinValueValidator(low))
            field.widget.attrs["min"] = low
            if high is not None:
                field.validators.append(MaxValueValidator(high))
                field.widget.attrs["max"] = high
            defaults = ", ".join(f"{plan} {values[name]:,}" for plan, values in table.items())
            bounds = f"{low}..{high}" if high is not None else f"at least {low}"
            field.help_text = f"Empty: the plan's default ({defaults}). Otherwise {bounds}."
        retention = self.fields.get("run_retention_days")
        if retention is not None:
            retention.validators += [MinValueValidator(0), MaxValueValidator(36500)]
            retention.widget.attrs.update(min=0, max=36500)
            retention.help_text = (f"Days finished runs are kept (docs/retention.md). Empty: the deployment's "
                                   f"{settings.FLOWFORGE_RUN_RETENTION_DAYS} (FLOWFORGE_RUN_RETENTION_DAYS); "
                                   "0 keeps them forever.")
        if "plan" in self.fields:
            self.fields["plan"].help_text = "Defaults of each limit: " + "; ".join(
                f"{plan}: " + ", ".join(f"{n} {values[n]:,}" for n in LIMIT_NAMES) for plan, values in table.items())

    def clean_name(self) -> str:
        """The rule of create and rename (``services.organization_name``): no control or
        invisible formatting character, such as a line break or a right-to-left override that
        would reach a mail's subject. Checked on every save, unlike the slug: a name stored
        before the rule is fixed in the same form (no client sends a name to find an
        organization)."""
        try:
            return organization_name(self.cleaned_data.get("name"))
        except TenancyError as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean_slug(self) -> str:
        """The rule of create (``services.organization_slug``), for a new or changed slug: one
        stored before the rule (the admin took any SlugField) is kept as it is when the form
        changes something else, since API clients may send it (``X-Organization``)."""
        if not self.instance._state.adding and "slug" not in self.changed_data:
            return self.cleaned_data.get("slug")
        try:
            return organization_slug(self.cleaned_data.get("slug"))
        except TenancyError as exc:
            raise forms.ValidationError(str(exc)) from exc


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    form = OrganizationAdminForm
    list_display = ("slug", "name", "plan", "created_at")
    list_filter = ("plan",)
    search_fields = ("slug", "name")
    inlines = [MembershipInline]
    # The split date-time widget drops microseconds: editable, every save "changed" it.
    readonly_fields = ("created_at",)
    fieldsets = (
        (None, {"fields": ("name", "slug", "created_at")}),
        ("Plan and limits (docs/scheduling.md)", {"fields": LIMIT_FIELDS}),
        ("History (docs/retention.md)", {"fields": ("run_retention_days",)}),
    )

    def construct_change_message(self, request, form, formsets, add=False):
        """Django's change message, and for the plan and limits each value before and
        after (the audit record's ``change``: audit.signals.on_admin_change)."""
        message = super().construct_change_message(request, form, formsets, add)
        changed = [f for f in (*LIMIT_FIELDS, "run_retention_days") if f in form.changed_data]
        if add or not changed:
            return message
        values = "; ".join(f"{f}: {_shown(form.initial.get(f))} -> {_shown(form.cleaned_data.get(f))}"
                           for f in changed)
        others = [f for f in form.changed_data if f not in LIMIT_FIELDS]
        text = f"Changed {values}." + (f" Also changed {', '.join(others)}." if others else "")
        # The inline's changes (members), in Django's words.
        rest = [m for m in message if not ("changed" in m and "name" not in m["changed"])]
        if rest:
            text += " " + str(LogEntry(change_message=json.dumps(rest)).get_change_message())
        return text


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("organization", "user", "role", "created_at")
    list_filter = ("role",)
    search_fields = ("user__email", "organization__slug")
    raw_id_fields = ("user", "organization")

    def get_queryset(self, request):
        return Membership.objects.unscoped().select_related("user", "organization")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are visible to staff (never their secret: only the prefix and an Argon2 hash exist)."""

    list_display = ("prefix", "name", "organization", "role", "created_at", "last_used_at", "revoked_at")
    list_filter = ("role",)
    search_fields = ("prefix", "name", "organization__slug")
    exclude = ("hashed_key",)
    readonly_fields = ("organization", "prefix", "role", "created_by", "created_at", "last_used_at", "expires_at",
                       "revoked_at", "revoked_by", "name")

    def get_queryset(self, request):
        return ApiKey.objects.unscoped().select_related("organization")

    def has_add_permission(self, request):
        return False  # keys are created by members (the secret is shown once to its creator)

    def has_delete_permission(self, request, obj=None):
        return False


def _shown(value) -> str:
    """A limit's value in a change message: "plan default" for an empty override."""
    return "plan default" if value is None or value == "" else str(value)
