"""Users, organizations and memberships (seed 000, "Tenancy and security")."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.contrib.auth.models import PermissionsMixin
from django.db import models
from django.utils import timezone

from tenancy.scoping import OrganizationScopedManager


class UserManager(BaseUserManager):
    """Creates users keyed by email (the login)."""

    use_in_migrations = True

    def _create(self, email: str, password: str | None, **extra):
        if not email:
            raise ValueError("a user needs an email address")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_user(self, email: str, password: str | None = None, **extra):
        extra.setdefault("is_staff", False)
        extra.setdefault("is_superuser", False)
        return self._create(email, password, **extra)

    def create_superuser(self, email: str, password: str | None = None, **extra):
        """A staff superuser (``manage.py createsuperuser``) whose address counts as verified:
        whoever runs the command on the server vouches for it, and with mandatory email
        verification (ACCOUNT_EMAIL_VERIFICATION) the admin's sign-in (allauth's, with its
        rate limits and MFA) would otherwise stop at "confirm your address" (issue 20)."""
        from allauth.account.models import EmailAddress

        extra.setdefault("is_staff", True)
        extra.setdefault("is_superuser", True)
        user = self._create(email, password, **extra)
        EmailAddress.objects.update_or_create(user=user, email=user.email,
                                              defaults={"verified": True, "primary": True})
        return user


class User(AbstractBaseUser, PermissionsMixin):
    """A person. The email address is the login."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    email = models.EmailField(unique=True)
    name = models.CharField(max_length=150, blank=True)
    is_staff = models.BooleanField(default=False)
    is_active = models.BooleanField(default=True)
    date_joined = models.DateTimeField(default=timezone.now)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    class Meta:
        db_table = "core_user"

    def __str__(self) -> str:
        return self.email


class Plan(models.TextChoices):
    """An organization's plan: the defaults of its scheduling weight and quotas
    (``settings.FLOWFORGE_PLANS``); staff change it, and any single limit, in the admin."""

    FREE = "free"
    TEAM = "team"
    BUSINESS = "business"


class Organization(models.Model):
    """The tenant. Every tenant row carries its id.

    Scheduling and quotas (issue 16): ``plan`` gives the defaults
    (``settings.FLOWFORGE_PLANS``); each ``*_override`` column, when set, replaces its
    plan's value for this organization. ``tenancy.limits.effective_limits`` resolves them.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    plan = models.CharField(max_length=20, choices=Plan.choices, db_default=Plan.FREE)
    # Share of the workers against other organizations with ready work (weighted fair share).
    weight_override = models.SmallIntegerField(null=True, blank=True)
    # At most this many task runs claimed or running at once.
    max_running_task_runs_override = models.IntegerField(null=True, blank=True)
    # At most this many runs started in any 60 s.
    max_runs_per_minute_override = models.IntegerField(null=True, blank=True)
    # At most this many bytes of stored workflow definitions (every version, JSON text).
    max_definition_bytes_override = models.BigIntegerField(null=True, blank=True)
    # Run retention in days (issue 21: engine.retention): finished runs older than this are
    # removed; NULL follows FLOWFORGE_RUN_RETENTION_DAYS, 0 keeps them forever. Staff set it.
    run_retention_days = models.IntegerField(null=True, blank=True)

    class Meta:
        db_table = "core_organization"
        constraints = [
            models.CheckConstraint(condition=models.Q(plan__in=["free", "team", "business"]), name="org_plan_valid"),
            models.CheckConstraint(
                condition=models.Q(run_retention_days__isnull=True)
                | models.Q(run_retention_days__gte=0, run_retention_days__lte=36500),
                name="org_run_retention_range",
            ),
            models.CheckConstraint(
                condition=models.Q(weight_override__isnull=True)
                | models.Q(weight_override__gte=1, weight_override__lte=100),
                name="org_weight_range",
            ),
            models.CheckConstraint(
                condition=models.Q(max_running_task_runs_override__isnull=True)
                | models.Q(max_running_task_runs_override__gte=1),
                name="org_max_running_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(max_runs_per_minute_override__isnull=True)
                | models.Q(max_runs_per_minute_override__gte=1),
                name="org_max_runs_per_minute_positive",
            ),
            models.CheckConstraint(
                condition=models.Q(max_definition_bytes_override__isnull=True)
                | models.Q(max_definition_bytes_override__gte=1),
                name="org_max_definition_bytes_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


class Membership(models.Model):
    """A user's role in one organization; unique on (organization, user)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_membership"
        indexes = [
            # GET /members/ and the members page, keyset-paginated: WHERE organization_id = ? ORDER BY
            # created_at DESC, id DESC (api.pagination.paginate_newest_first).
            models.Index(models.F("organization"), models.F("created_at").desc(), models.F("id").desc(),
                         name="idx_membership_org_recent"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["organization", "user"], name="uniq_membership_org_user"),
            models.CheckConstraint(
                condition=models.Q(role__in=["owner", "admin", "member", "viewer"]),
                name="membership_role_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.organization_id} as {self.role}"


ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


class KeyRole(models.TextChoices):
    """The roles of an API key: a member's roles, and ``worker`` (issue 18): a key of the
    organization's own worker processes, which may only poll, heartbeat, log and complete
    its organization's worker tasks (docs/workers.md) and do nothing else, not even read.
    No membership has the worker role."""

    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"
    WORKER = "worker"


#: A key role's rank: ROLE_RANK's, and the worker role below every member role (a worker key
#: acts with its own role whatever its creator's: ``min_role`` picks it).
KEY_ROLE_RANK = {**ROLE_RANK, KeyRole.WORKER: -1}


class InvitationState(models.TextChoices):
    """What became of an invitation, as the API reports it (not stored: read from its
    accepted_at, revoked_at and expires_at)."""

    PENDING = "pending"
    ACCEPTED = "accepted"
    REVOKED = "revoked"
    EXPIRED = "expired"


class Invitation(models.Model):
    """An emailed invitation to join an organization with a role.

    The token is single-use and expires; only its SHA-256 is stored (``token_hash``),
    so a database reader cannot accept an invitation. At most one pending invitation
    per (organization, email).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64)
    invited_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    # The API key it was sent with, if any: revoking the key withdraws its pending invitations.
    invited_by_api_key = models.ForeignKey("ApiKey", null=True, blank=True, on_delete=models.SET_NULL,
                                           related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_invitation"
        indexes = [
            # GET /invitations/, keyset-paginated: the pending ones, WHERE organization_id = ? AND
            # accepted_at IS NULL AND revoked_at IS NULL ORDER BY created_at DESC, id DESC.
            models.Index(models.F("organization"), models.F("created_at").desc(), models.F("id").desc(),
                         name="idx_invitation_org_pending",
                         condition=models.Q(accepted_at__isnull=True, revoked_at__isnull=True)),
        ]
        constraints = [
            models.UniqueConstraint(fields=["token_hash"], name="uniq_invitation_token"),
            # One pending invitation per address: the invite list is a single row per person.
            models.UniqueConstraint(
                fields=["organization", "email"],
                condition=models.Q(accepted_at__isnull=True, revoked_at__isnull=True),
                name="uniq_invitation_pending",
            ),
            models.CheckConstraint(
                condition=models.Q(role__in=["owner", "admin", "member", "viewer"]), name="invitation_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.organization_id} as {self.role}"

    @property
    def is_pending(self) -> bool:
        return self.accepted_at is None and self.revoked_at is None and self.expires_at > timezone.now()


class ApiKey(models.Model):
    """An API key of one organization (seed 000: ``prefix`` unique, ``hashed_key`` a
    password hash of the secret, never the secret).

    The full key is ``ffk_<prefix>_<secret>``; only the prefix (public, shown in
    lists) and an Argon2 hash of the secret are stored. A key acts with at most its
    creator's role.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)
    hashed_key = models.CharField(max_length=200)
    role = models.CharField(max_length=20, choices=KeyRole.choices, default=KeyRole.MEMBER)
    created_by = models.ForeignKey(User, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_apikey"
        indexes = [
            # GET /api-keys/ and the API keys page, keyset-paginated: WHERE organization_id = ? ORDER BY
            # created_at DESC, id DESC (revoked keys included).
            models.Index(models.F("organization"), models.F("created_at").desc(), models.F("id").desc(),
                         name="idx_apikey_org_recent"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["prefix"], name="uniq_apikey_prefix"),
            models.CheckConstraint(
                condition=models.Q(role__in=["owner", "admin", "member", "viewer", "worker"]),
                name="apikey_role_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"ffk_{self.prefix}_… ({self.name})"


# A secret's name: how task configs reference it ({{ secrets.NAME }}). The same pattern
# is the CHECK constraint secret_name_valid and engine.secret_refs' reference syntax.
SECRET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


class Secret(models.Model):
    """A named secret value of one organization (issue 18), referenced from task configs
    as ``{{ secrets.NAME }}`` and resolved only when an attempt starts.

    ``ciphertext`` is a Fernet token under FLOWFORGE_SECRET_KEYS (tenancy.vault); the
    value is never stored in clear and never returned by the API or the pages.
    ``version`` starts at 1 and is bumped by every change of the value. The actor of the
    first and of the last change: a user (``*_by``) or an API key (``*_by_api_key``).
    Unique on (organization, name); tenancy.vault writes every change with its audit
    record (name and version, never the value).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: uniq_secret_org_name leads with organization_id.
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="secrets",
                                     db_index=False)
    name = models.CharField(max_length=64)
    ciphertext = models.TextField()
    version = models.IntegerField(default=1)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by_api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL,
                                           related_name="+")
    updated_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    updated_by_api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL,
                                           related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = OrganizationScopedManager()

    class Meta:
        db_table = "core_secret"
        constraints = [
            models.UniqueConstraint(fields=["organization", "name"], name="uniq_secret_org_name"),
            models.CheckConstraint(condition=models.Q(name__regex=SECRET_NAME_PATTERN), name="secret_name_valid"),
            models.CheckConstraint(condition=models.Q(version__gte=1), name="secret_version_positive"),
        ]

    def __str__(self) -> str:
        return f"secret {self.name} of {self.organization_id} (v{self.version})"


# The columns of a joined row that hold a credential, never needed to show who did what:
# a user's password hash and an API key's hash.
CREDENTIAL_FIELDS: dict[type[models.Model], str] = {User: "password", ApiKey: "hashed_key"}


def without_credentials(queryset: models.QuerySet, *relations: str) -> models.QuerySet:
    """``queryset.select_related(*relations)`` with the password hash of each user and the
    hash of each API key it reads left out of the SELECT (``defer``), the rows' own (a list
    of keys) and the joined ones' (a creator, a member, the key that started a run): a page
    or an API answer that names them never reads a credential into memory. Authentication
    reads them with queries of its own.

    ``relations`` are select_related paths (``"created_by"``, ``"trigger__created_by"``);
    a path whose last model is neither a user nor an API key is joined as it is. Raises
    FieldDoesNotExist for a path that does not name a relation of ``queryset``'s model.
    """
    own = CREDENTIAL_FIELDS.get(queryset.model)
    deferred: list[str] = [own] if own is not None else []
    for path in relations:
        model: Any = queryset.model
        for part in path.split("__"):
            model = model._meta.get_field(part).related_model
        field = CREDENTIAL_FIELDS.get(model)
        if field is not None:
            deferred.append(f"{path}__{field}")
    return queryset.select_related(*relations).defer(*deferred)
