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

#: Sent by ``manage.py rotate_secret_keys`` once the organizations' secrets are re-encrypted
#: under the first key of FLOWFORGE_SECRET_KEYS, with ``batch_size``: a receiver re-encrypts
#: its own values under those keys (the engine: webhook signing secrets) the same way and
#: returns ``(what, tenancy.vault.RotationResult)``, e.g. ``("webhook secrets", result)``,
#: which the command reports (and fails on, when some value could not be decrypted).
secret_keys_rotated = Signal()
