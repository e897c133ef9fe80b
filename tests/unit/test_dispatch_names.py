"""Messages are sent by actor name (engine.dispatch): the names and queues it uses are
the actors' own (engine.actors), so a message never goes to a queue no worker reads."""

from __future__ import annotations

import dramatiq

from engine import actors, dispatch
from engine.states import TASK_QUEUE


def test_every_declared_actor_is_in_the_dispatch_table_on_its_own_queue():
    declared = {a.actor_name: a.queue_name for a in vars(actors).values() if isinstance(a, dramatiq.Actor)}
    assert declared == dispatch.ACTOR_QUEUES


def test_a_message_by_name_is_the_one_the_actor_would_build():
    by_name = dispatch.message("schedule_tick")
    by_actor = actors.schedule_tick.message()
    assert (by_name.queue_name, by_name.actor_name, by_name.args, by_name.kwargs) == (
        by_actor.queue_name, by_actor.actor_name, by_actor.args, by_actor.kwargs)
    one = dispatch.dispatch_message([("t1", 3)])
    assert (one.queue_name, one.actor_name, one.args) == (TASK_QUEUE, "execute_task_run", ("t1", 3))
    many = dispatch.dispatch_message([("t1", 3), ("t2", 5)])
    assert (many.queue_name, many.actor_name, many.args) == (TASK_QUEUE, "execute_task_runs", ([["t1", 3], ["t2", 5]],))


def test_the_lease_owner_names_its_role_host_and_process():
    owner = dispatch.process_owner("worker")
    role, _, rest = owner.partition("@")
    assert role == "worker" and rest.rsplit(":", 1)[1].isdigit()
