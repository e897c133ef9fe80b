"""The engine: workflow definitions, runs, and the machinery that executes their tasks.

Package map, top to bottom. A module imports only from the rows below its own (``a | b``:
siblings that never import each other; ``a : b``: siblings that may). The import-linter
contract "Engine layers" in pyproject.toml checks it in ``make test``.

    actors.py | management/ | apps.py | admin.py
        actors: the Dramatiq actors (clock ticks, nudges, execute messages); nothing
        imports them. management/: the commands. apps/admin: Django's wiring.
    worker/
        one attempt of one generation: execute (the attempt's flow), batching (starts
        and completions recorded together, behind the Completer interface), combiner
        (the batching's thread hand-over), heartbeat (extends worker leases), handoff
        (generations a busy thread gives back to the broker), output (the result's
        size and shape, the failure's traceback), log_shipper (writes the lines the
        attempts capture).
    backfill.py
        backfills of cron triggers: one run per past instant of a range, through cron's
        start of an instant (preview, create, cancel, and the pass that goes on with them).
    scheduler.py | reaper.py | sweeper.py | cron.py | notifier.py
        claim ready task runs; take back expired leases; close finished and timed-out
        runs; fire due cron triggers; claim and send the notifications' outbox (webhook
        POSTs, failure emails: docs/notifications.md).
    services.py | signals.py | worker_queues.py | recovery.py | task_detail.py
        services: what the API, the web UI and the commands call (start, cancel, retry
        runs; apply workflows). signals: the engine's receivers of tenancy's hooks.
        worker_queues: what the worker API's calls do (poll, heartbeat, logs, complete,
        fail) for the organizations' own workers (docs/workers.md). recovery: what a
        person does about a failed run (resume it in place; retry, mark succeeded or
        skip one of its task runs). task_detail: one task run read whole for the API and
        the run page's task panel (its attempts with their logs and tracebacks, its input
        as configured, its upstream outputs).
    notifications.py
        webhook endpoints (create, change, rotate the secret, delete), failure
        subscriptions and the replay of a delivery: what the API and the pages call.
    relay.py
        publish outbox rows to the broker and stamp them (a new run's roots, claimed by
        services.start_run, are published through it after the commit).
    dispatch.py
        messages by actor name and their queues, the lease owner string.
    repositories/
        every statement that writes runs, task runs and events: runs, task_runs, events
        (operations named <table>.<verb>[_many]), driver (prepared statements, one
        message per transaction, retries), types (the requests and results they pass).
    live_stream.py
        the one live-event loop of the API's event stream and the web run page.
    definitions.py | triggers.py | reporting.py | live_hub.py | outputs.py | live_limits.py | access.py | queue_hub.py
        workflow documents (validation); cron triggers (create, pause, next instant);
        read-side summaries (and quota usage); the shared LISTEN connection of live streams
        (live_hub) and of the worker queues' long polls (queue_hub); output size
        helpers; stream limits; access_* (a tenant object by id: one "not found" for
        missing and foreign).
    limit_keys.py | input_schema.py | conditions.py
        concurrency keys' placeholders: their one written form, and their rendering from
        a run input (definitions store keys in that form; start_run and triggers render).
        input_schema: a workflow's run input JSON Schema, checked at definition time and
        applied (defaults, then validation) at every start, fenced for a shared deployment
        (no remote references, RE2 patterns, a work budget).
        conditions: a task's CEL condition, checked for definitions and evaluated, with
        bounded cost, before the handler (the worker, and the worker API's poll).
    handlers/ : egress.py : secret_refs.py : attempt_log.py : webhooks.py : patterns.py
        task types (noop, sleep, fail, python, http, worker) and the egress policy http
        (and webhooks) obey; webhooks: an endpoint URL's rules, the signature, one POST;
        secret references in task configs ({{ secrets.NAME }}): found and checked at
        definition time, resolved when an attempt starts, and the values redacted from
        what the attempt leaves behind (it reads tenancy.vault); attempt_log: what a
        running handler logs and prints, kept per attempt (per thread, by context
        variable), redacted and capped. patterns: members' regular expressions (input
        schemas, conditions' matches) compiled by RE2 at a bounded cost, cached per text.
    models.py | db.py | metrics.py | live.py | trigger_rules.py
        the tables; transaction retry helpers; counters; LISTEN/NOTIFY primitives
        (JSON hygiene is flowforge.jsonb, shared with the audit log); trigger_rules: a
        rule's verdict on given upstream outcomes, in Python (what a retry of one task and
        the run page's buttons ask; the engine decides in SQL).
    sql/
        every statement the engine runs, whole and named, in *.sql files (one per table,
        metrics.sql for the /metrics gauges), each with the index it relies on; loaded
        by name (``sql.queries``).
    states.py
        the vocabulary: run and task-run states, event kinds, terminal and open sets,
        queue names.

The life of a task in that order: ``services.start_run`` writes the run and its task
runs (roots ``ready``), claims its roots in the same transaction (the scheduler's fair
claim: room, permits and buckets decide) and publishes them after the commit
(``relay.publish_dispatches``); what it could not claim, the scheduler does when nudged
(``dispatch.nudge_scheduler``): ``scheduler.schedule_once`` claims and writes outbox rows
in one statement (``repositories``) and publishes them; the worker
(``actors.execute_task_run`` -> ``worker``) starts the generation, heartbeats, runs the
handler (``handlers``; first its condition, ``conditions``: false skips it) and records
the completion, which decides the dependents by their trigger rules (ready, skipped, or
waiting) and, in the same transaction, claims for its organization (the fair claim,
below); a failure or a skip settles the dependents the same way
(``task_runs.settle_dependents``);
``reaper`` and ``sweeper`` take back what a crash left behind. docs/scheduling.md tells
how organizations share the workers. A run's end and a task run's failure are also
recorded as notifications, in the same transaction, by a trigger on the run's history
(migration 0028), and sent by ``notifier`` (docs/notifications.md).

Glossary
--------
run
    One execution of one workflow version (``WorkflowRun``): pending -> running ->
    succeeded | failed | cancelled (``states.RunState``).
task run
    One task of one run (``TaskRun``); a retry reuses the row (``states.TaskRunState``).
trigger rule
    ``Task.trigger_rule`` (``states.TriggerRule``, Airflow's names): when a task with
    dependencies runs, by its upstream task runs' outcomes; ``all_success`` by default.
condition
    ``Task.condition``: a CEL expression on the run input, upstream outputs and cron instant
    (``conditions``); false skips the task run (``skip_reason`` ``condition_false``).
attempt
    One execution of a task run's handler; ``TaskRun.attempt`` counts them, and a
    dispatch that never started uses none.
generation
    One claim of a task run: each claim bumps its fencing token, and a message, a start
    and a completion each name the generation they belong to. A person's action on a
    finished task run (engine.recovery) bumps it too.
resume
    A finished run sent back to running in place by a person (engine.recovery): the task
    runs that did not succeed, and those downstream, are reopened as new generations;
    succeeded ones keep their outputs. ``attempt`` counts on, ``attempt_base`` renews the
    retry budget.
fencing token
    ``TaskRun.fencing_token``, the generation's number. Every write by a worker matches
    it; a write for an older generation is rejected (``stale_completion_rejected``).
dispatch lease vs worker lease
    Both are held in ``TaskRun.lease_expires_at`` (seed 000's column; the name stays).
    The dispatch lease (``FLOWFORGE_DISPATCH_LEASE_SECONDS``, ``dispatch_lease_seconds``)
    runs from the claim until a worker starts the generation: if it runs out the message
    was lost, and the reaper makes the task run ready again (``dispatch_expired``, no
    attempt used). The worker lease (``FLOWFORGE_LEASE_SECONDS``,
    ``worker_lease_seconds``) runs from the start and is extended by the worker's
    heartbeat: if it runs out the worker died, and the attempt fails (``lease_expired``).
outbox row
    ``OutboxMessage``: one dispatch of one generation, written in the claim's
    transaction and published by the relay after the commit, so a claim and its message
    never disagree (``published_at`` is stamped once the broker took it).
continuation
    A dependent that a worker's completion claimed and that the same worker thread runs
    next (up to ``FLOWFORGE_INLINE_CONTINUATIONS`` hops), with no message sent: the
    thread's start stamps its outbox row, and if the thread dies first the relay
    publishes the row once the claim's reservation (``INLINE_PUBLISH_RESERVATION_SECONDS``)
    has passed.
owner
    ``lease_owner``: who holds the lease, ``role@host:pid`` (``dispatch.process_owner``):
    ``scheduler@`` for the scheduler's claims, ``worker@`` for the dependents a worker's
    completion claims (``worker@host:pid:thread`` once a worker thread started it),
    ``reaper@`` for the retries a reaper's expiry claims.
hand-off
    A worker thread that holds several generations of one message and is busy with one
    gives the others back to the broker (each its own message), so they do not wait
    behind it.
fair claim
    ``task_run_claim_fair``, the one statement that moves task runs ready -> running:
    weighted round robin between organizations, priority then age within one, under
    each organization's claim lock (an advisory lock taken before any row lock).
room
    What an organization may claim now: the lesser of its quota of running task runs
    (``max_running_task_runs``) less those running, and ``FLOWFORGE_DISPATCH_AHEAD`` x its
    weight less its generations claimed but not started.
permit
    A running task run with a ``concurrency_key`` holds one of that key's permits; the
    permit is leased with the task run, so every way out of running gives it back.
rate bucket
    ``RateLimitBucket``: claims of one key in its open fixed window (seed 001).
lane
    Where in the task queue an execute message goes: the first lane (an organization's
    first ``FLOWFORGE_DISPATCH_FIRST`` x weight generations waiting for a worker) to its
    head, the bulk lane to its tail (routing keys ``states.TASK_FIRST_QUEUE`` and
    ``states.TASK_QUEUE``).
wait reason
    Why a ready task run is not claimed (``repositories.waiting``): shown by the API and
    the run page, and written as a 'waiting' event when it changes.
"""
