"""Who is acting: a user (through the browser or a command), an API key, or the system."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Actor:
    """The caller of a service function, with the organization it acts in.

    ``role`` is the effective role in ``organization``: a member's role, or for an
    API key the lesser of the key's role and its creator's current role. ``channel``
    says how the request came in ("web", "api", "cli", "system").
    """

    organization: Any
    role: str | None
    user: Any = None
    api_key: Any = None
    channel: str = "web"

    @property
    def kind(self) -> str:
        if self.api_key is not None:
            return "api_key"
        if self.user is not None:
            return "user"
        return "system"

    @classmethod
    def system(cls, organization: Any) -> Actor:
        """The engine itself (cron firings, reaper): acts with the owner role."""
        return cls(organization=organization, role="owner", channel="system")
