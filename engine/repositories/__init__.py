"""The engine's database operations, grouped by what they write (after River's driver
interface: ``JobGetAvailable``, ``JobSetStateIfRunningMany``).

Naming: ``<module>.<verb>[_<what>][_many]``. The module is the table whose rows the
operation changes (the events every transition appends do not count); the verb says the
change; ``_many`` marks an operation on a batch; a read starts with ``get_``. The
statement each one runs is in ``engine/sql/<table>.sql``, named
``<table in the singular>_<verb>...`` (``task_runs.claim_ready_many`` runs
``task_run_claim_ready``).

=====================  =====================================================================
module                 operations
=====================  =====================================================================
``task_runs``          ``claim_ready_many``, ``start_and_complete_many``, ``heartbeat_many``,
                       ``fail_attempt``, ``fail_undelivered``, ``get_expired_leases``,
                       ``expire_lease``, ``settle_dependents`` (the trigger rules after a
                       finish), ``skip_for_condition``
``runs``               ``create_with_task_runs``, ``finish_if_done``, ``cancel``
``events``             ``append``, ``append_ignored_start``, ``append_stale_completion``
``recovery``           a person's transitions (engine.recovery; ``engine/sql/recovery.sql``):
                       ``lock_run``, ``reopen_run``, ``reopen_task_runs``,
                       ``mark_succeeded``, ``mark_skipped``, ``promote_dependents``
``waiting``            ``reasons``, ``run_reasons`` (why ready task runs and queued runs
                       wait), ``note_waiting`` (``wait_reason`` and a ``waiting`` event
                       when the reason changes; ``engine/sql/waiting.sql``)
``driver``             how statements reach PostgreSQL: ``run_prepared`` (one message per
                       transaction, prepared once per connection), ``fetch``,
                       ``autocommit_retry``, ``in_own_transaction``
``types``              the requests and results (``StartRequest``, ``SuccessRequest``,
                       ``Dispatch``, ``StartedAttempt``, ``CompletionResult``); the
                       vocabulary (states, ``TASK_QUEUE``) is ``engine.states``
=====================  =====================================================================

The outbox rows are written by the claims (``task_runs``); the relay's statements are in
``engine/sql/outbox.sql``.
"""
