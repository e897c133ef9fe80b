"""An organization's scheduling weight and quotas: its plan's defaults, each replaced by
the organization's own override when staff set one (issue 16; docs/scheduling.md).

``effective_limits(org)`` is what the API, the settings page and the quota checks read;
``plan_table()`` is the same table for SQL statements that resolve every organization at
once (the fair claim), as parallel arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings

#: The limit names, each an Organization ``<name>_override`` column and a key of every
#: plan in ``settings.FLOWFORGE_PLANS``.
LIMIT_NAMES: tuple[str, ...] = ("weight", "max_running_task_runs", "max_runs_per_minute", "max_definition_bytes")


class QuotaExceeded(Exception):
    """An organization's quota refuses an action. ``limit`` names the quota (one of
    ``LIMIT_NAMES``, or a platform-wide send limit: ``invitations_per_day``,
    ``invitations_per_day_per_user``), ``allowed`` its value, ``used`` what is in use, and
    ``retry_after_seconds`` when waiting helps (None when it does not); the message says
    all of it in words."""

    def __init__(self, message: str, *, limit: str, allowed: int, used: int,
                 retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.allowed = allowed
        self.used = used
        self.retry_after_seconds = retry_after_seconds


@dataclasses.dataclass(frozen=True)
class Limits:
    """One organization's effective limits (``LIMIT_NAMES``), and its plan."""

    plan: str
    weight: int
    max_running_task_runs: int
    max_runs_per_minute: int
    max_definition_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plans() -> dict[str, dict[str, int]]:
    """``settings.FLOWFORGE_PLANS``: plan name -> {limit name: default}. Raises
    ImproperlyConfigured-like ValueError naming a plan that lacks a limit."""
    table = settings.FLOWFORGE_PLANS
    for name, values in table.items():
        missing = [k for k in LIMIT_NAMES if k not in values]
        if missing:
            raise ValueError(f"FLOWFORGE_PLANS[{name!r}] lacks {', '.join(missing)}")
    return table


def effective_limits(organization) -> Limits:
    """The organization's limits: each override column when set, else its plan's default."""
    defaults = plans().get(organization.plan) or plans()["free"]
    values = {}
    for name in LIMIT_NAMES:
        override = getattr(organization, f"{name}_override")
        values[name] = int(override if override is not None else defaults[name])
    return Limits(plan=organization.plan, **values)


def plan_table() -> dict[str, list]:
    """The plans as parallel arrays for a SQL statement (``unnest``): ``plan_names``,
    ``plan_weights``, ``plan_max_running``; an organization whose plan is not listed is
    treated as ``free`` by the statements."""
    table = plans()
    names = list(table)
    return {
        "plan_names": names,
        "plan_weights": [int(table[n]["weight"]) for n in names],
        "plan_max_running": [int(table[n]["max_running_task_runs"]) for n in names],
    }
