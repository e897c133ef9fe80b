"""The permission matrix: which role may do what (one place; the API, the web UI,
the commands and the services all ask ``can`` / ``require``).

| action            | owner | admin | member | viewer |
|-------------------|:-----:|:-----:|:------:|:------:|
| read              |  yes  |  yes  |  yes   |  yes   |
| run.operate       |  yes  |  yes  |  yes   |   -    |  start, cancel, re-run, resume runs; retry,
|                   |       |       |        |        |  mark succeeded, skip a task run
| workflow.edit     |  yes  |  yes  |  yes   |   -    |  workflows and cron triggers
| member.manage     |  yes  |  yes  |   -    |   -    |  invite, change roles, remove (owner role: owners only)
| apikey.manage     |  yes  |  yes  |   -    |   -    |
| secret.manage     |  yes  |  yes  |   -    |   -    |  create, rotate, delete secrets (values are never read back)
| webhook.manage    |  yes  |  yes  |   -    |   -    |  webhook endpoints: list, create, change, rotate, delete; delivery log, replay
| audit.read        |  yes  |  yes  |   -    |   -    |
| org.manage        |  yes  |   -   |   -    |   -    |  rename, settings

The ``worker`` role is an API key's only (tenancy.models.KeyRole): it may do one thing,
``worker.serve`` (poll, heartbeat, log and complete its organization's worker tasks,
docs/workers.md), which no other role may: not even ``read``.
"""

from __future__ import annotations

from enum import StrEnum

from tenancy.models import KEY_ROLE_RANK, ROLE_RANK, KeyRole, Role


class Action(StrEnum):
    READ = "read"
    RUN_OPERATE = "run.operate"
    WORKFLOW_EDIT = "workflow.edit"
    MEMBER_MANAGE = "member.manage"
    APIKEY_MANAGE = "apikey.manage"
    #: Create, rotate and delete the organization's secrets. Their names and metadata are
    #: READ; members reference them from definitions with WORKFLOW_EDIT; nobody reads a value.
    SECRET_MANAGE = "secret.manage"
    #: The organization's webhook endpoints (issue 19): read them (their URLs may carry a
    #: receiver's token), create, change, rotate their signing secret, delete, read their
    #: delivery log and replay a delivery. Failure emails are each member's own (READ).
    WEBHOOK_MANAGE = "webhook.manage"
    AUDIT_READ = "audit.read"
    ORG_MANAGE = "org.manage"
    WORKER_SERVE = "worker.serve"


MATRIX: dict[str, frozenset[Action]] = {
    Role.OWNER: frozenset(Action) - {Action.WORKER_SERVE},
    Role.ADMIN: frozenset(Action) - {Action.ORG_MANAGE, Action.WORKER_SERVE},
    Role.MEMBER: frozenset({Action.READ, Action.RUN_OPERATE, Action.WORKFLOW_EDIT}),
    Role.VIEWER: frozenset({Action.READ}),
    KeyRole.WORKER: frozenset({Action.WORKER_SERVE}),
}


class Forbidden(PermissionError):
    """The actor's role does not allow the action. The message names both."""


def can(role: str | None, action: Action | str) -> bool:
    """True when ``role`` may perform ``action`` (False for no role)."""
    return role is not None and Action(action) in MATRIX.get(role, frozenset())


def roles_with(action: Action | str) -> list[str]:
    """The member roles that may perform ``action``, highest first (the worker key role is
    not a member's: see ``who_may``)."""
    return [str(role) for role in sorted(ROLE_RANK, key=ROLE_RANK.get, reverse=True) if can(role, action)]


def who_may(action: Action | str) -> str:
    """``action`` and who may perform it, for a refusal: "apikey.manage, which only the owner
    and admin roles have"."""
    action = Action(action)
    roles = roles_with(action)
    if not roles:
        holders = "which only a worker API key has" if can(KeyRole.WORKER, action) else "which no role has"
    elif len(roles) == len(Role):
        holders = "which every member role has"
    elif len(roles) == 1:
        holders = f"which only the {roles[0]} role has"
    else:
        holders = f"which only the {', '.join(roles[:-1])} and {roles[-1]} roles have"
    return f"{action.value}, {holders}"


def require(role: str | None, action: Action | str) -> None:
    """Raise Forbidden unless ``role`` may perform ``action``; its message names the role,
    the action and the roles that may ("role 'viewer' may not do this: it needs
    member.manage, which only the owner and admin roles have")."""
    if not can(role, action):
        label = str(role) if role else "none"  # a Role member prints as its value
        raise Forbidden(f"role {label!r} may not do this: it needs {who_may(action)}")


def min_role(a: str, b: str) -> str:
    """The lesser of two roles (a key acts with at most its creator's role; a worker key,
    as a worker whatever its creator's role)."""
    return a if KEY_ROLE_RANK[a] <= KEY_ROLE_RANK[b] else b


def role_at_least(role: str | None, floor: str) -> bool:
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[floor]
