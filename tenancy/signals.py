"""Hooks that tenancy sends for higher layers to act on (tenancy never imports them).

``member_departed`` is sent inside the transaction that removes a membership (a removal
by someone else or the member leaving), after the membership row is deleted, with:

- ``actor``: the ``tenancy.actors.Actor`` who removed the member (the member, when leaving);
- ``membership``: the deleted ``Membership`` (its ``organization_id`` and ``user`` still set);
- ``reason``: ``"removed"`` or ``"left"``.

Receivers change data in that same transaction (e.g. the engine pauses the departed
member's cron triggers, with an audit record); an exception in a receiver rolls the
removal back, so the removal and its consequences commit together or not at all.
"""

from __future__ import annotations

from django.dispatch import Signal

member_departed = Signal()
