"""Deleting a cron trigger while the clock fires it must not deadlock (found by the API fuzz
test: a 500 "deadlock detected" on DELETE /api/v1/triggers/<id>/).

The clock locks the trigger's row, then appends to the organization's audit chain (which
takes the chain's lock); the delete must take them in the same order."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from audit import services as audit
from engine.models import ScheduledTrigger
from engine.triggers import create_trigger, delete_trigger
from tenancy.context import actor_for_membership
from tenancy.models import Membership, Role


@pytest.mark.django_db(transaction=True)
def test_a_trigger_deleted_while_the_clock_holds_it_is_deleted_without_a_deadlock(org, make_workflow):
    make_workflow(org, [{"key": "a", "type": "noop"}], name="nightly")
    owner = Membership.objects.for_organization(org).select_related("user", "organization").get(role=Role.OWNER)
    actor = actor_for_membership(owner)
    trigger = create_trigger(actor=actor, data={"name": "t", "workflow_name": "nightly", "cron_expression": "* * * * *"})

    row_locked, delete_started = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def clock() -> None:  # what a firing does: the row first, then the audit chain
        try:
            with transaction.atomic():
                ScheduledTrigger.objects.for_organization(org).select_for_update().get(pk=trigger.pk)
                row_locked.set()
                delete_started.wait(5)
                threading.Event().wait(0.5)  # let the delete reach its first lock
                audit.record("trigger.fired", organization=org.pk, target=trigger, metadata={"note": "test"})
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)
        finally:
            connection.close()

    def delete() -> None:
        try:
            row_locked.wait(5)
            delete_started.set()
            delete_trigger(actor=actor, trigger=trigger)
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=clock), threading.Thread(target=delete)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert not ScheduledTrigger.objects.for_organization(org).filter(pk=trigger.pk).exists()
