"""API keys: creation, revocation and authentication (seed 000, "Tenancy and security":
``core_apikey.prefix`` unique, ``hashed_key`` a password hash, never the secret).

A key reads ``ffk_<prefix>_<secret>``. The prefix (12 of ``[a-z0-9]``) is public: it
is shown in lists and finds the row. The secret (``secrets.token_urlsafe(32)``, 256
bits) is shown once and stored only as an Argon2id hash.

Authentication is cheap without weakening storage: a verified key is cached for
``CACHE_TTL_SECONDS`` in the shared (Redis) cache under its prefix, holding only the
SHA-256 of the secret and the key's id, organization, role, creator and expiry. A
cache hit compares SHA-256 digests in constant time and skips Argon2; anything else
(miss, mismatch, tombstone) takes the Argon2 path against the database, so timing
does not tell which prefixes are cached. Revocation writes a tombstone for the prefix
(before and again after the commit) and deletes the entry; while the tombstone lives
the cache entry is ignored, so a reader that raced the revocation and re-populated
the cache cannot resurrect the key.

A key acts with at most its creator's role: the effective role is the lesser of the
key's role and the creator's *current* membership role in the key's organization,
read on every request, so a demotion or a departure takes effect at once.

Creation and revocation append an audit record (``api_key.created``/``api_key.revoked``,
naming the prefix, never the secret) in the transaction of the change.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import hmac
import logging
import re
import secrets
import string
import time
import uuid

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit import services as audit
from tenancy.actors import Actor
from tenancy.authority import cap_to_grantor
from tenancy.models import KEY_ROLE_RANK, ApiKey, Invitation, KeyRole, Organization, User
from tenancy.permissions import Action, Forbidden, require
from tenancy.services import TenancyError

log = logging.getLogger(__name__)

KEY_SCHEME = "ffk"
PREFIX_LENGTH = 12
PREFIX_ALPHABET = string.ascii_lowercase + string.digits
# token_urlsafe(32): 32 random bytes = 256 bits, 43 characters of [A-Za-z0-9_-].
SECRET_BYTES = 32
NAME_MAX_LENGTH = 100
# Longer secrets are accepted (a future key format); the cap bounds the work a garbage header can cause.
_RAW_KEY_RE = re.compile(r"^ffk_([a-z0-9]{12})_([A-Za-z0-9_-]{43,128})\Z")  # \Z: "$" lets a final newline in
# Attempts at drawing an unused prefix; 36**12 values make even a second draw rare.
_PREFIX_ATTEMPTS = 5

# Argon2id with OWASP's recommended minimum (19 MiB, 2 passes, 1 lane): about 25 ms a
# verification. The secret is 256 random bits, so the hash protects against nothing
# a brute force could reach; it is there so a leaked table is not a set of live keys.
HASHER = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1, hash_len=32, salt_len=16, type=Type.ID)

# Seconds a verified key stays in the cache: how long Argon2 (about 25 ms here, 45 ms on a
# busy 2-core host) is skipped for it. An hour, so a key's first request after an idle
# minute is as fast as any other (issue 17). What the entry lets through is bounded
# otherwise: roles and memberships are read live on every request, never from this cache;
# a revocation's tombstone hides the entry at once; the entry keeps the key's expiry; and
# it holds a SHA-256 of a 256-bit secret, not the secret; and a hit still reads whether
# the key is revoked (in the creator's membership query it makes anyway), so a revocation
# whose tombstone did not reach the cache takes effect at once.
CACHE_TTL_SECONDS = 3600
# Seconds a revocation tombstone lives. Longer than CACHE_TTL_SECONDS plus
# CACHE_WRITE_DEADLINE_SECONDS, so any entry written by a reader that raced the
# revocation expires while the tombstone still hides it.
TOMBSTONE_TTL_SECONDS = 2 * CACHE_TTL_SECONDS
# Seconds between reading the row and writing the cache after which a reader does not
# cache (a stalled reader must not outlive the tombstone with a stale entry).
CACHE_WRITE_DEADLINE_SECONDS = 5.0
_CACHE_FORMAT = 1
# Failed authentications are counted per prefix per clock minute of this many seconds;
# the 1st, 10th, 100th, ... of a window are audited (_record_failure).
FAILURE_WINDOW_SECONDS = 60

# The conditional write of last_used_at: at most once a minute per key, however many
# requests and processes use it; the WHERE clause, not a lock, settles races.
_TOUCH_SQL = (
    "UPDATE core_apikey SET last_used_at = now() "
    "WHERE id = %s AND (last_used_at IS NULL OR last_used_at < now() - interval '60 seconds')"
)


@dataclasses.dataclass(frozen=True)
class AuthenticatedKey:
    """A key that passed ``authenticate``: what a request acting through it may use.

    ``role`` is the key's own role; ``effective_role`` the lesser of it and the
    creator's current role in ``organization`` (the role to authorize with).
    """

    id: uuid.UUID
    prefix: str
    name: str
    organization: Organization
    role: str
    effective_role: str
    created_by: User
    expires_at: dt.datetime | None

    @property
    def pk(self) -> uuid.UUID:
        return self.id

    def __str__(self) -> str:
        return f"ffk_{self.prefix}_… ({self.name})"


# --- cache keys ----------------------------------------------------------------------------------
# Django prepends settings.CACHES["default"]["KEY_PREFIX"] (and the version) to each; the
# prefix namespace is the tenant-identifying part (a prefix belongs to one organization).


def _entry_key(prefix: str) -> str:
    return f"apikey:v{_CACHE_FORMAT}:entry:{prefix}"


def _tombstone_key(prefix: str) -> str:
    return f"apikey:v{_CACHE_FORMAT}:revoked:{prefix}"


def _touched_key(prefix: str) -> str:
    # Present for LAST_USED_RESOLUTION_SECONDS after a request wrote last_used_at.
    return f"apikey:v{_CACHE_FORMAT}:touched:{prefix}"


# --- hashing -------------------------------------------------------------------------------------


@functools.cache
def _dummy_hash() -> str:
    """An Argon2 hash with HASHER's parameters of a secret nobody holds: unknown prefixes
    are verified against it so they cost as much as a wrong secret."""
    return HASHER.hash(secrets.token_urlsafe(SECRET_BYTES))


def _verify(hashed: str, secret: str) -> bool:
    try:
        return HASHER.verify(hashed, secret)
    except (VerificationError, InvalidHashError):
        return False


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_key(raw_key: str) -> tuple[str, str] | None:
    """Split ``ffk_<prefix>_<secret>`` into (prefix, secret); None when malformed."""
    match = _RAW_KEY_RE.match(raw_key or "")
    return (match.group(1), match.group(2)) if match else None


def _new_prefix() -> str:
    return "".join(secrets.choice(PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))


# --- creation and revocation ---------------------------------------------------------------------


def create_api_key(*, actor: Actor, name: str, role: str,
                   expires_at: dt.datetime | None = None) -> tuple[ApiKey, str]:
    """Create an API key of ``actor.organization`` with ``role``, created by ``actor.user``.

    Returns (api_key, full_key); the full key ``ffk_<prefix>_<secret>`` exists only in
    this return value: the row holds the prefix and an Argon2 hash of the secret.

    Raises Forbidden when the actor may not manage API keys, when ``role`` is above the
    actor's role, or when the actor is not a user (a key cannot mint keys: a leaked key
    could otherwise outlive its own revocation through its children). Raises
    TenancyError for an empty or over-long name, an unknown role, or an expiry that
    is not in the future.
    """
    require(actor.role, Action.APIKEY_MANAGE)
    if actor.user is None:
        raise Forbidden("API keys are created by a signed-in user, not by another API key")
    if role not in KeyRole.values:
        raise TenancyError(f"role {role!r}: expected one of {', '.join(KeyRole.values)}")
    if KEY_ROLE_RANK[role] > KEY_ROLE_RANK[actor.role]:
        raise Forbidden(f"a {actor.role} cannot create a key with the {role} role")
    name = (name or "").strip()
    if not name:
        raise TenancyError("name must not be empty")
    if len(name) > NAME_MAX_LENGTH:
        raise TenancyError(f"name is {len(name)} characters; at most {NAME_MAX_LENGTH}")
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise TenancyError("expires_at needs a time zone")
        if expires_at <= timezone.now():
            raise TenancyError("expires_at must be in the future")
    secret = secrets.token_urlsafe(SECRET_BYTES)
    hashed = HASHER.hash(secret)
    with transaction.atomic():  # the key and its audit record, together or not at all
        api_key = _insert_with_fresh_prefix(
            organization=actor.organization, name=name, hashed_key=hashed, role=role, created_by=actor.user,
            expires_at=expires_at,
        )
        audit.record("api_key.created", actor=actor, target=api_key, metadata={
            "name": name, "role": role, "prefix": api_key.prefix,
            "expires_at": expires_at.isoformat() if expires_at is not None else None,
        })
    return api_key, f"{KEY_SCHEME}_{api_key.prefix}_{secret}"


def _insert_with_fresh_prefix(**fields) -> ApiKey:
    """Insert the row under a random unused prefix, drawing again on the rare collision."""
    for attempt in range(1, _PREFIX_ATTEMPTS + 1):
        try:
            # A savepoint: a prefix collision must not abort the enclosing transaction.
            with transaction.atomic():
                return ApiKey.objects.create(prefix=_new_prefix(), **fields)
        except IntegrityError as exc:
            if "uniq_apikey_prefix" not in str(exc) or attempt == _PREFIX_ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _write_tombstone(prefix: str) -> None:
    cache.set(_tombstone_key(prefix), 1, timeout=TOMBSTONE_TTL_SECONDS)


def _forget(prefix: str) -> None:
    """After the revocation committed: refresh the tombstone, then drop the entry."""
    _write_tombstone(prefix)
    cache.delete(_entry_key(prefix))


def revoke_api_key(*, actor: Actor, api_key: ApiKey) -> ApiKey:
    """Revoke ``api_key`` (of ``actor.organization``); idempotent. Returns the row.

    Once the transaction commits, every process refuses the key on its next request:
    the tombstone is written before the commit (so there is no window between the
    commit and the on-commit hook) and again on commit together with deleting the
    cached entry. A failed cache write is logged, not raised: revoking a leaked key
    must work while Redis is down (an entry left there is refused anyway: a cache hit
    reads whether its key is unrevoked, in the creator's membership query).

    ``revoked_by`` is the acting user, or for an API key its creator. The key's pending
    invitations are revoked with it (``invitation.revoked``, reason ``api_key_revoked``).
    Raises Forbidden without apikey.manage, ApiKey.DoesNotExist when the key is not
    the actor's organization's.
    """
    require(actor.role, Action.APIKEY_MANAGE)
    with transaction.atomic():
        row = ApiKey.objects.for_organization(actor.organization).select_for_update().get(pk=api_key.pk)
        if row.revoked_at is None:
            _revoke_locked(actor=actor, row=row)
    return row


def revoke_keys_of_departing_member(*, actor: Actor, membership, reason: str) -> int:
    """Revoke every unrevoked API key ``membership``'s user created in its organization,
    as ``revoke_api_key`` does (each with an ``api_key.revoked`` record naming ``reason``:
    ``creator_removed`` or ``creator_left``). Returns how many. Called inside the removal's
    transaction (``tenancy.services.remove_member``), which has checked the actor's right
    to remove. A key already refuses requests once its creator is no longer a member
    (``cap_to_grantor``); revoking it too means the list says so and a re-invited creator
    does not bring it back."""
    rows = ApiKey.objects.for_organization(membership.organization_id).select_for_update().filter(
        created_by_id=membership.user_id, revoked_at__isnull=True).order_by("created_at", "id")
    revoked = 0
    for row in rows:
        _revoke_locked(actor=actor, row=row, reason=reason)
        revoked += 1
    return revoked


def _revoke_locked(*, actor: Actor, row: ApiKey, reason: str | None = None) -> None:
    """Revoke ``row`` (locked by the caller's transaction, not yet revoked): the tombstone
    before the commit and again with the cached entry's removal on commit, ``revoked_at``
    and ``revoked_by`` (the acting user, or for an API key its creator), an
    ``api_key.revoked`` record (with ``reason`` when given), and the key's pending
    invitations (``invitation.revoked``, reason ``api_key_revoked``)."""
    try:
        _write_tombstone(row.prefix)
    except Exception:
        log.warning("could not write the revocation tombstone of key %s before commit", row.prefix, exc_info=True)
    row.revoked_at = timezone.now()
    row.revoked_by = actor.user if actor.user is not None else getattr(actor.api_key, "created_by", None)
    row.save(update_fields=["revoked_at", "revoked_by"])
    audit.record("api_key.revoked", actor=actor, target=row, metadata={
        "name": row.name, "prefix": row.prefix, **({"reason": reason} if reason else {})})
    # Invitations it sent leave with it: a leaked key must not keep minting members.
    pending = Invitation.objects.for_organization(row.organization_id).select_for_update().filter(
        invited_by_api_key=row, accepted_at__isnull=True, revoked_at__isnull=True).order_by("created_at", "id")
    for inv in pending:
        inv.revoked_at = row.revoked_at
        inv.save(update_fields=["revoked_at"])
        audit.record("invitation.revoked", actor=actor, target=inv,
                     metadata={"email": inv.email, "role": inv.role, "reason": "api_key_revoked",
                               "key_prefix": row.prefix})
    prefix = row.prefix
    transaction.on_commit(lambda: _forget(prefix), robust=True)


# --- authentication ------------------------------------------------------------------------------


def _authenticated(*, key_id, prefix, name, role, organization_id, creator_id,
                   expires_at, live_key: bool = False) -> AuthenticatedKey | None:
    # The same rule as an invitation's acceptance (tenancy.authority): at most the
    # creator's current role, nothing once the creator is no longer an active member.
    # live_key: the key's row was not read (a cache hit): check it is unrevoked too.
    grant = cap_to_grantor(role, organization_id=organization_id, grantor_id=creator_id,
                           unrevoked_key_id=key_id if live_key else None)
    if grant is None:
        return None
    return AuthenticatedKey(
        id=key_id,
        prefix=prefix,
        name=name,
        organization=grant.membership.organization,
        role=role,
        effective_role=grant.role,
        created_by=grant.membership.user,
        expires_at=expires_at,
    )



def still_valid(key: AuthenticatedKey) -> bool:
    """Whether ``key``, authenticated earlier in this request, would still authenticate
    with the same effective role now: not revoked, not expired, its creator still an
    active member whose role does not cap it lower. For a request that outlives its
    authentication (a worker's long poll, up to 30 s) to re-check before it acts again.
    One query; reads no cache (a revocation takes effect at once)."""
    if key.expires_at is not None and key.expires_at <= timezone.now():
        return False
    grant = cap_to_grantor(key.role, organization_id=key.organization.pk, grantor_id=key.created_by.pk,
                           unrevoked_key_id=key.id)
    return grant is not None and grant.role == key.effective_role

# last_used_at is kept to this many seconds: the conditional UPDATE below, and on the
# cache-hit path a marker in the cache, read in the hit's one MGET.
LAST_USED_RESOLUTION_SECONDS = 60


def touch_last_used(key_id) -> int:
    """Set last_used_at = now() unless it was set in the last minute. Returns rows updated (0 or 1)."""
    with connection.cursor() as cur:
        cur.execute(_TOUCH_SQL, [key_id])
        return cur.rowcount


def _cache_get(prefix: str) -> tuple[dict | None, bool, bool]:
    """(entry, tombstoned, touched: last_used_at was written in the last minute) in one
    MGET; a cache failure reads as (None, True, True): use the database."""
    try:
        got = cache.get_many([_entry_key(prefix), _tombstone_key(prefix), _touched_key(prefix)])
    except Exception:
        log.warning("API key cache unavailable; verifying against the database", exc_info=True)
        return None, True, True
    tombstoned = _tombstone_key(prefix) in got
    touched = _touched_key(prefix) in got
    entry = got.get(_entry_key(prefix))
    if tombstoned or not isinstance(entry, dict) or entry.get("v") != _CACHE_FORMAT:
        return None, tombstoned, touched
    return entry, False, touched


def _touch_from_cache_hit(prefix: str, key_id) -> None:
    """On a cache hit whose key has no 'touched' marker: mark it for a minute, then write
    last_used_at (the UPDATE's WHERE clause still keeps it to one write a minute when
    several processes race past the marker). A failure is logged: the request goes on."""
    try:
        if cache.add(_touched_key(prefix), 1, timeout=LAST_USED_RESOLUTION_SECONDS):
            touch_last_used(key_id)
    except Exception:  # noqa: BLE001 - last_used_at is informational; never fail the request for it
        log.warning("could not record the use of API key %s", prefix, exc_info=True)


def _cache_put(prefix: str, entry: dict, *, expires_at: dt.datetime | None) -> None:
    ttl = float(CACHE_TTL_SECONDS)
    if expires_at is not None:
        ttl = min(ttl, (expires_at - timezone.now()).total_seconds())
    if ttl < 1:
        return
    try:
        cache.set(_entry_key(prefix), entry, timeout=ttl)
    except Exception:
        log.warning("could not cache API key %s", prefix, exc_info=True)


def failure_clock() -> float:
    """Seconds since the epoch that place a failure in its window (a function so a test can pin it)."""
    return time.time()


def _count_failure(counter: str) -> int | None:
    """Add one to this clock minute's failure counter ``counter`` (in the shared cache,
    so every web process counts together) and return the new count; None when the cache
    cannot be reached."""
    key = f"{counter}:{int(failure_clock() // FAILURE_WINDOW_SECONDS)}"
    try:
        for _ in range(2):
            cache.add(key, 0, timeout=2 * FAILURE_WINDOW_SECONDS)
            try:
                return cache.incr(key)
            except ValueError:  # expired between add and incr: start it again
                continue
    except Exception as exc:  # noqa: BLE001 - any cache failure: audit every failure, loudly
        log.warning("API key failure counter unavailable (%s); auditing the failure", type(exc).__name__)
    return None


def _audited_failure(counter: str) -> tuple[bool, int | None]:
    """Count a failed authentication under ``counter``: (audit it?, failures of the window
    so far). Audited: the 1st, 10th, 100th, ... failure of the window, and every failure
    while the cache is unreachable (count None)."""
    count = _count_failure(counter)
    if count is None:
        return True, None
    return str(count).rstrip("0") == "1", count  # 1, 10, 100, ...: a power of ten


def _record_failure(row: ApiKey, reason: str) -> None:
    """Audit a failed authentication with a known prefix (``api_key.auth_failed``), at
    most 1 + log10(N) records for N failures of one prefix in a clock minute (the 1st,
    10th, 100th, ...), each naming the failures of the window so far
    (``failures_this_minute``), so guessing at another organization's prefix cannot
    grow that organization's audit chain without bound. The request's transaction is
    kept for this record even though the request fails (api.exceptions commits an
    authentication failure's transaction)."""
    audited, count = _audited_failure(f"org:{row.organization_id}:api-key-auth-failed:{row.prefix}")
    if not audited:
        return
    actor = Actor(organization=row.organization_id, role=None, api_key=row, channel="api")
    audit.record("api_key.auth_failed", actor=actor, target=row,
                 metadata={"reason": reason, "prefix": row.prefix, "failures_this_minute": count})


def authenticate(raw_key: str) -> AuthenticatedKey | None:
    """The key ``raw_key`` names, verified, with its effective role; None when it is
    malformed, unknown, wrong, expired or revoked, or its creator is no longer an
    active member of its organization. Never raises for a bad key.

    An unknown prefix costs an Argon2 verification against a dummy hash, and a cache
    hit with a wrong secret falls through to the Argon2 path, so neither the
    existence of a prefix nor its presence in the cache shows in the timing.
    """
    parsed = parse_key(raw_key)
    if parsed is None:
        return None
    prefix, secret = parsed
    digest = _sha256(secret)
    entry, tombstoned, touched = _cache_get(prefix)
    if entry is not None and hmac.compare_digest(entry["sha256"], digest):
        expires_at = dt.datetime.fromtimestamp(entry["exp"], dt.UTC) if entry["exp"] is not None else None
        if expires_at is not None and expires_at <= timezone.now():
            return None
        # The cache skips Argon2 only: whether the key is still unrevoked is read live, in
        # the creator's membership query, so a revocation whose tombstone never reached
        # the cache (Redis away at that moment) takes effect at once, not after the hour.
        result = _authenticated(
            key_id=uuid.UUID(entry["id"]), prefix=prefix, name=entry["name"], role=entry["role"],
            organization_id=entry["org"], creator_id=entry["creator"], expires_at=expires_at, live_key=True,
        )
        if result is not None and not touched:
            _touch_from_cache_hit(prefix, result.id)
        return result

    started = time.monotonic()
    # Unscoped on purpose: the prefix is the credential's public half and names its
    # organization; nothing of the row leaves this function unless the secret verifies.
    row = (
        ApiKey.objects.unscoped()
        .filter(prefix=prefix)
        .only("id", "organization_id", "name", "prefix", "hashed_key", "role", "created_by_id",
              "expires_at", "revoked_at")
        .first()
    )
    if row is None:
        _verify(_dummy_hash(), secret)
        # Recorded for staff (account-level chain), and so this path does the same work
        # as a known prefix's failure: the two take about the same time.
        # Counted and sampled like a known prefix's failures (same work, bounded rows).
        audited, count = _audited_failure(f"api-key-auth-failed:{prefix}")
        if audited:
            audit.record("api_key.auth_failed",
                         metadata={"reason": "unknown_prefix", "prefix": prefix, "failures_this_minute": count})
        return None
    if not _verify(row.hashed_key, secret):
        _record_failure(row, "wrong_secret")
        return None
    if row.revoked_at is not None:
        _record_failure(row, "revoked")
        return None
    if row.expires_at is not None and row.expires_at <= timezone.now():
        _record_failure(row, "expired")
        return None
    result = _authenticated(
        key_id=row.pk, prefix=prefix, name=row.name, role=row.role, organization_id=row.organization_id,
        creator_id=row.created_by_id, expires_at=row.expires_at,
    )
    if result is None:
        _record_failure(row, "creator_not_a_member")
        return None
    if HASHER.check_needs_rehash(row.hashed_key):
        # Parameters changed since the key was made: upgrade the stored hash in place.
        ApiKey.objects.unscoped().filter(pk=row.pk, hashed_key=row.hashed_key).update(hashed_key=HASHER.hash(secret))
    # The WHERE clause keeps it to one write a minute whatever the cache does; the marker
    # spares the cache hits of the next minute the UPDATE.
    touch_last_used(row.pk)
    try:
        cache.set(_touched_key(prefix), 1, timeout=LAST_USED_RESOLUTION_SECONDS)
    except Exception:  # noqa: BLE001 - at worst the next hit sends the (conditional) UPDATE
        log.warning("could not mark API key %s as used", prefix, exc_info=True)
    if not tombstoned and time.monotonic() - started < CACHE_WRITE_DEADLINE_SECONDS:
        _cache_put(
            prefix,
            {
                "v": _CACHE_FORMAT,
                "sha256": digest,
                "id": str(row.pk),
                "org": str(row.organization_id),
                "role": row.role,
                "creator": str(row.created_by_id) if row.created_by_id is not None else None,
                "name": row.name,
                "exp": row.expires_at.timestamp() if row.expires_at is not None else None,
            },
            expires_at=row.expires_at,
        )
    return result


__all__ = [
    "CACHE_TTL_SECONDS",
    "HASHER",
    "LAST_USED_RESOLUTION_SECONDS",
    "TOMBSTONE_TTL_SECONDS",
    "AuthenticatedKey",
    "authenticate",
    "create_api_key",
    "parse_key",
    "revoke_api_key",
    "still_valid",
    "touch_last_used",
]
