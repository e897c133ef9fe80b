-- What a person does to a run after a failure (engine.recovery, issue 19): resume it, and
-- retry, mark succeeded or skip one of its task runs. The engine never moves a finished
-- run or task run back; only these statements do, each matched on the row's state and
-- fencing token, and each bumping the token, so a message or a completion of any older
-- generation matches nothing (stale_completion_rejected, as for any stale worker).
--
-- An action's transaction takes run_lock_row first (a cancel takes it too, after a first
-- look at the open task runs, and looks again: repositories/runs.cancel; so does the
-- sweeper before it closes a run), then run_reopen, then the task runs' statements; what
-- runs next is left
-- to the engine's own statements (task_run_promote_dependents for the succeeded task runs
-- upstream of those reopened, task_run_skip_descendants for the finished ones that did
-- not succeed, run_finish_if_done for the run's end), as after any completion.
--
-- The task runs' events are numbered as in task_runs.sql (the CTEs ev_rows, ev_counts,
-- ev_seq and ev_ins, written out the same). Parameters are psycopg's: %(name)s.


-- name: run_lock_row
-- Lock the run's row (run) for the rest of the transaction and read its state: a person's action takes it before any of the run's task runs, a cancel after its first look at the open ones (and then looks again), the sweeper before closing the run, so none of them misses the task runs an action reopens; core_workflowrun_pkey.
SELECT state FROM core_workflowrun WHERE id = %(run)s FOR UPDATE


-- name: run_reopen
-- A finished run (run) goes back to running for a person's action: finished_at and error cleared, resumed_at now (its run timeout counts from it), a 'resumed' event (detail); returns the state it left; core_workflowrun_pkey. After run_lock_row, before the task runs' statements.
WITH prev AS (
    SELECT id, state FROM core_workflowrun
    WHERE id = %(run)s AND state IN ('succeeded', 'failed', 'cancelled')
), re AS (
    UPDATE core_workflowrun r
    SET state = 'running', finished_at = NULL, error = '', resumed_at = clock_timestamp(),
        -- A run cancelled while it was queued behind its run limit never started.
        started_at = COALESCE(r.started_at, clock_timestamp()),
        last_event_seq = r.last_event_seq + 1
    FROM prev p
    WHERE r.id = p.id AND r.state IN ('succeeded', 'failed', 'cancelled')
    RETURNING r.id, r.organization_id, r.last_event_seq, p.state AS old_state, r.created_at
)
INSERT INTO core_taskrunevent
    (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
     attempt, fencing_token, detail, created_at, run_created_at)
SELECT gen_random_uuid(), re.organization_id, re.id, NULL, re.last_event_seq, 'resumed', re.old_state,
       'running', NULL, NULL, %(detail)s::jsonb, clock_timestamp(), re.created_at
FROM re
RETURNING from_state


-- name: task_run_reopen_many
-- A person reopens finished task runs (ids, tokens, from_states, to_states; each matched on its state and fencing token by primary key): -> pending (ready, from now, for a task without dependencies), token + 1, the next attempt (one past the last that started) with a fresh budget (attempt_base), output, error, times, lease and backoff cleared; a 'reset' event each (detail); returns the ids reopened; core_taskrun_pkey, idx_event_taskrun_created.
WITH req AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[], %(from_states)s::text[], %(to_states)s::text[])
        AS a(id, token, from_state, to_state)
), nxt AS (
    -- Its current attempt number if that attempt never started (a task skipped or
    -- cancelled before its start, or sent back to ready for a retry that never came),
    -- else the next one: attempt numbers of a task run never repeat.
    SELECT req.*, t.attempt + CASE WHEN EXISTS (
               SELECT 1 FROM core_taskrunevent e                  -- idx_event_taskrun_created
               WHERE e.task_run_id = t.id AND e.kind = 'started' AND e.attempt = t.attempt)
           THEN 1 ELSE 0 END AS attempt
    FROM req JOIN core_taskrun t ON t.id = req.id
), re AS (
    UPDATE core_taskrun t
    SET state = n.to_state, fencing_token = t.fencing_token + 1, attempt = n.attempt, attempt_base = n.attempt - 1,
        output = NULL, error = '', started_at = NULL, finished_at = NULL, lease_owner = NULL,
        lease_expires_at = NULL, not_before = NULL, wait_reason = '', skip_reason = '',
        ready_at = CASE WHEN n.to_state = 'ready' THEN clock_timestamp() ELSE t.ready_at END
    FROM nxt n
    WHERE t.id = n.id AND (t.state || '') = n.from_state AND t.fencing_token = n.token   -- by primary key
      AND n.from_state IN ('succeeded', 'failed', 'skipped', 'cancelled') AND n.to_state IN ('pending', 'ready')
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, n.from_state, n.to_state
), tr AS (
    SELECT r.id, r.workflow_run_id, r.organization_id, r.attempt, r.fencing_token,
           'reset'::text AS ev_kind, r.from_state AS ev_from, r.to_state AS ev_to, %(detail)s::jsonb AS ev_detail
    FROM re r
), ev_rows AS (
    SELECT tr.*, row_number() OVER (PARTITION BY tr.workflow_run_id ORDER BY tr.id) AS rn
    FROM tr
), ev_counts AS (
    SELECT workflow_run_id, count(*) AS n FROM tr GROUP BY workflow_run_id
), ev_seq AS (
    UPDATE core_workflowrun r SET last_event_seq = r.last_event_seq + c.n
    FROM ev_counts c WHERE r.id = c.workflow_run_id
    RETURNING r.id, r.last_event_seq - c.n AS base, r.created_at AS run_created_at
), ev_ins AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at, run_created_at)
    SELECT gen_random_uuid(), e.organization_id, e.workflow_run_id, e.id, s.base + e.rn, e.ev_kind,
           e.ev_from, e.ev_to, e.attempt, e.fencing_token, e.ev_detail, clock_timestamp(), s.run_created_at
    FROM ev_rows e JOIN ev_seq s ON s.id = e.workflow_run_id
)
SELECT id FROM re


-- name: task_run_mark_succeeded
-- A person marks a failed, skipped or cancelled task run (id, matched on from_state and token) succeeded with output (JSON text): token + 1, error, start, lease and backoff cleared, finished now; a 'marked_succeeded' event (detail); returns (id, fencing_token); core_taskrun_pkey.
WITH done AS (
    UPDATE core_taskrun t
    -- No attempt made it: started_at is cleared (its duration would count the time since the
    -- failed attempt's start); the events keep that attempt.
    SET state = 'succeeded', output = %(output)s::jsonb, error = '', fencing_token = t.fencing_token + 1,
        started_at = NULL, finished_at = clock_timestamp(), lease_owner = NULL, lease_expires_at = NULL,
        not_before = NULL, wait_reason = '', skip_reason = ''
    WHERE t.id = %(id)s AND (t.state || '') = %(from_state)s AND t.fencing_token = %(token)s   -- by primary key
      AND %(from_state)s IN ('failed', 'skipped', 'cancelled')
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token,
           'marked_succeeded'::text AS ev_kind, %(from_state)s::text AS ev_from, 'succeeded'::text AS ev_to,
           %(detail)s::jsonb AS ev_detail
    FROM done d
), ev_rows AS (
    SELECT tr.*, row_number() OVER (PARTITION BY tr.workflow_run_id ORDER BY tr.id) AS rn
    FROM tr
), ev_counts AS (
    SELECT workflow_run_id, count(*) AS n FROM tr GROUP BY workflow_run_id
), ev_seq AS (
    UPDATE core_workflowrun r SET last_event_seq = r.last_event_seq + c.n
    FROM ev_counts c WHERE r.id = c.workflow_run_id
    RETURNING r.id, r.last_event_seq - c.n AS base, r.created_at AS run_created_at
), ev_ins AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at, run_created_at)
    SELECT gen_random_uuid(), e.organization_id, e.workflow_run_id, e.id, s.base + e.rn, e.ev_kind,
           e.ev_from, e.ev_to, e.attempt, e.fencing_token, e.ev_detail, clock_timestamp(), s.run_created_at
    FROM ev_rows e JOIN ev_seq s ON s.id = e.workflow_run_id
)
SELECT id, fencing_token FROM done


-- name: task_run_mark_skipped
-- A person marks a failed or cancelled task run (id, matched on from_state and token) skipped (skip_reason marked): token + 1, error, start, lease and backoff cleared, finished now; a 'marked_skipped' event (detail); returns (id, fencing_token); core_taskrun_pkey.
WITH done AS (
    UPDATE core_taskrun t
    SET state = 'skipped', error = '', fencing_token = t.fencing_token + 1,
        started_at = NULL, finished_at = clock_timestamp(), lease_owner = NULL, lease_expires_at = NULL,
        not_before = NULL, wait_reason = '', skip_reason = 'marked'
    WHERE t.id = %(id)s AND (t.state || '') = %(from_state)s AND t.fencing_token = %(token)s   -- by primary key
      AND %(from_state)s IN ('failed', 'cancelled')
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token,
           'marked_skipped'::text AS ev_kind, %(from_state)s::text AS ev_from, 'skipped'::text AS ev_to,
           %(detail)s::jsonb AS ev_detail
    FROM done d
), ev_rows AS (
    SELECT tr.*, row_number() OVER (PARTITION BY tr.workflow_run_id ORDER BY tr.id) AS rn
    FROM tr
), ev_counts AS (
    SELECT workflow_run_id, count(*) AS n FROM tr GROUP BY workflow_run_id
), ev_seq AS (
    UPDATE core_workflowrun r SET last_event_seq = r.last_event_seq + c.n
    FROM ev_counts c WHERE r.id = c.workflow_run_id
    RETURNING r.id, r.last_event_seq - c.n AS base, r.created_at AS run_created_at
), ev_ins AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at, run_created_at)
    SELECT gen_random_uuid(), e.organization_id, e.workflow_run_id, e.id, s.base + e.rn, e.ev_kind,
           e.ev_from, e.ev_to, e.attempt, e.fencing_token, e.ev_detail, clock_timestamp(), s.run_created_at
    FROM ev_rows e JOIN ev_seq s ON s.id = e.workflow_run_id
)
SELECT id, fencing_token FROM done
