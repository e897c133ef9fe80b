"""Staff administration of people and organizations. Every change made here is
recorded in the audit log (audit.signals records each admin LogEntry)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin

from tenancy.models import ApiKey, Membership, Organization, User


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


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ("user",)

    def get_queryset(self, request):
        # Staff see every organization: an explicit, reviewed cross-tenant read.
        return Membership.objects.unscoped().select_related("user")


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")
    inlines = [MembershipInline]


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
