-- Statements that change runs (core_workflowrun), each with the event it appends.
-- A run's terminal state is derived after the statement that bumped its event counter,
-- so under READ COMMITTED it sees every transition of the run committed before.
-- Parameters are psycopg's: %(name)s.


-- name: run_insert
-- A new run in state (running from now, or pending: queued behind its workflow's run limit, not started) with priority, its event counter at 0, the API key that started it (api_key, NULL for anyone else), and its cron instant and data interval (scheduled_for, interval_start, interval_end: all NULL for a run no trigger or backfill started); core_workflowrun_pkey.
INSERT INTO core_workflowrun
    (id, organization_id, workflow_id, state, input, trigger_source, triggered_by_id, api_key_id, retry_of_id,
     trigger_id, error, priority, last_event_seq, created_at, started_at,
     scheduled_for, data_interval_start, data_interval_end)
VALUES (%(run)s, %(org)s, %(wf)s, %(state)s, %(input)s, %(source)s, %(user)s, %(api_key)s, %(retry_of)s,
        %(trigger)s, '', %(priority)s, 0, clock_timestamp(),
        CASE WHEN %(state)s = 'running' THEN clock_timestamp() END,
        %(scheduled_for)s, %(interval_start)s, %(interval_end)s);


-- name: run_lock
-- Take the transaction-scoped advisory lock on key (a text: 'runs-per-minute:<org>' for the organization's start quota, 'workflow-runs:<org>:<name>' for a workflow name's run limit) so the count that follows is exact under READ COMMITTED; no table or index: a lock on the key's 64-bit hash.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));


-- name: run_count_recent
-- The organization's (org) runs created in the last window seconds, counted up to limit (n), and the seconds until the oldest of those counted leaves the window (free_in); idx_wfrun_org_recent (organization, created_at DESC), at most limit entries.
SELECT count(*)::int AS n,
       EXTRACT(EPOCH FROM min(r.created_at) + make_interval(secs => %(window)s) - clock_timestamp())::float8 AS free_in
FROM (SELECT created_at FROM core_workflowrun
      WHERE organization_id = %(org)s AND created_at > clock_timestamp() - make_interval(secs => %(window)s)
      ORDER BY created_at DESC LIMIT %(limit)s) r;


-- name: run_count_open_of_name
-- The runs of every version of workflow name in the organization (org) still going: running and pending (queued) counts; uniq_workflow_name_version for the versions, then idx_wfrun_open_by_workflow per version.
SELECT count(*) FILTER (WHERE r.state = 'running')::int AS running,
       count(*) FILTER (WHERE r.state = 'pending')::int AS queued
FROM core_workflow w
JOIN core_workflowrun r ON r.workflow_id = w.id
WHERE w.organization_id = %(org)s AND w.name = %(name)s AND r.state IN ('pending', 'running');


-- name: run_list_oldest_open_of_name
-- The ids of the oldest limit runs still going (running or pending) of every version of workflow name in the organization (org), oldest first (cancel_oldest makes room by cancelling them); uniq_workflow_name_version, then idx_wfrun_open_by_workflow per version.
SELECT r.id
FROM core_workflow w
JOIN core_workflowrun r ON r.workflow_id = w.id
WHERE w.organization_id = %(org)s AND w.name = %(name)s AND r.state IN ('pending', 'running')
ORDER BY r.created_at, r.id
LIMIT %(limit)s;


-- name: run_list_queued_names
-- The (organization, workflow name) pairs with runs queued (pending) behind a run limit, up to limit pairs; idx_wfrun_state_age (state = 'pending'), then core_workflow_pkey.
SELECT DISTINCT r.organization_id, w.name
FROM core_workflowrun r
JOIN core_workflow w ON w.id = r.workflow_id
WHERE r.state = 'pending'
LIMIT %(limit)s;


-- name: run_admit_queued
-- Admit the oldest queued (pending) runs of workflow name in the organization (org), up to limit, while the name has fewer running runs than each run's version allows (max_running_runs): run -> running (started_at, a 'run_admitted' event), its root task runs -> ready (ready_at); uniq_workflow_name_version, idx_wfrun_open_by_workflow, uniq_taskrun_per_run_task. Run after run_lock on 'workflow-runs:<org>:<name>', in the same transaction.
WITH running AS (
    SELECT count(*) AS n
    FROM core_workflow w JOIN core_workflowrun r ON r.workflow_id = w.id
    WHERE w.organization_id = %(org)s AND w.name = %(name)s AND r.state = 'running'
), queued AS (
    SELECT r.id, w.max_running_runs AS m,
           row_number() OVER (ORDER BY r.created_at, r.id) AS place
    FROM core_workflow w JOIN core_workflowrun r ON r.workflow_id = w.id
    WHERE w.organization_id = %(org)s AND w.name = %(name)s AND r.state = 'pending'
    ORDER BY r.created_at, r.id
    LIMIT %(limit)s
), picked AS (
    -- Oldest first: the run in place p fits when p more running runs stay within its limit.
    SELECT q.id FROM queued q, running c
    WHERE c.n + q.place <= coalesce(q.m, 2147483647)
), adm AS (
    UPDATE core_workflowrun r
    SET state = 'running', started_at = clock_timestamp(), last_event_seq = r.last_event_seq + 1
    FROM picked p
    WHERE r.id = p.id AND r.state = 'pending'
    RETURNING r.id, r.organization_id, r.last_event_seq, r.created_at
), roots AS (
    UPDATE core_taskrun t
    SET state = 'ready', ready_at = clock_timestamp()
    FROM adm a
    WHERE t.workflow_run_id = a.id AND t.state = 'pending'
      AND NOT EXISTS (SELECT 1 FROM core_taskdependency d WHERE d.task_id = t.task_id)
    RETURNING t.id
), ev AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at, run_created_at)
    SELECT gen_random_uuid(), a.organization_id, a.id, NULL, a.last_event_seq, 'run_admitted',
           'pending', 'running', NULL, NULL, '{}'::jsonb, clock_timestamp(), a.created_at
    FROM adm a
)
SELECT a.id, (SELECT count(*) FROM roots) AS roots FROM adm a;


-- name: run_finish_if_done
-- The run (run) becomes failed (a task run failed and nothing handled it), cancelled or succeeded, with a 'run_finished' event, once none of its task runs is open; returns (id, state, limited: its workflow has max_running_runs); idx_taskrun_run_state (one probe for an open row).
WITH runs AS (
    SELECT %(run)s::uuid AS id
), done_runs AS (
    -- One probe of idx_taskrun_run_state per run. LATERAL ... LIMIT 1 keeps it a per-run
    -- probe (as an anti-join the planner may read every open task run of every run). The
    -- open states (pending, ready, running) are the ones between 'failed' and 'skipped',
    -- written as row comparisons, which only idx_taskrun_run_state can use: any condition on
    -- the state alone ("state IN (...)", a state range, even "state > 'failed'") lets a
    -- generic plan made under the statistics of an idle table (nothing open) take
    -- idx_taskrun_state_age (state first), filtered by run, which walked every open task run
    -- of the deployment, other organizations' backlogs included, for each run it asked about.
    -- The run equality and ORDER BY state keep it off uniq_taskrun_per_run_task and a sort of
    -- the whole run. The scan starts at the run's first entry: its cancelled and failed
    -- entries (deduplicated in the index) come before the first open one
    -- (tests/unit/test_hot_statement_plans.py).
    SELECT r.id, c.failed, c.keys, c.cancelled
    FROM runs r
    LEFT JOIN LATERAL (SELECT 1 AS one FROM core_taskrun t
                       WHERE t.workflow_run_id = r.id
                         AND (t.workflow_run_id, t.state) > (r.id, 'failed')
                         AND (t.workflow_run_id, t.state) < (r.id, 'skipped')
                       ORDER BY t.state LIMIT 1) o ON true
    -- Counted once per run, when it is done: one pass over its task runs (index only).
    CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE t.state = 'failed') AS failed,
                               count(*) FILTER (WHERE t.state = 'cancelled') AS cancelled
                        FROM core_taskrun t WHERE t.workflow_run_id = r.id AND o.one IS NULL) n
    -- Of its failures, those nothing handled (docs/api.md, "A run's final state"): a failure
    -- is handled by a task with trigger rule one_failed or all_failed that depends on it,
    -- directly or through task runs skipped for it (skip_reason 'upstream_failed'), started
    -- after it failed (or marked succeeded after it failed) and succeeded. Looked for only when a task run failed, by (run, task)
    -- (idx_taskrun_run_state, uniq_taskrun_per_run_task); the states compared as
    -- expressions so that no plan reads every failed, skipped or succeeded task run of the
    -- table by state (idx_taskrun_state_age).
    -- Their task keys (unhandled), first failed first: named in the run's error.
    CROSS JOIN LATERAL (SELECT CASE WHEN n.failed = 0 THEN NULL ELSE (
                            SELECT array_agg(fk.key ORDER BY f.finished_at, fk.key)
                            FROM core_taskrun f JOIN core_task fk ON fk.id = f.task_id
                            WHERE f.workflow_run_id = r.id AND (f.state || '') = 'failed' AND NOT EXISTS (
                                WITH RECURSIVE carried(task_id) AS (
                                    SELECT f.task_id
                                    UNION
                                    SELECT e.task_id FROM carried x
                                    JOIN core_taskdependency e ON e.depends_on_id = x.task_id
                                    -- One probe per edge (LIMIT: not flattened into a join
                                    -- that reads the run's task runs per row; see
                                    -- task_run_skip_descendants).
                                    CROSS JOIN LATERAL (SELECT s.state, s.skip_reason FROM core_taskrun s
                                                        WHERE s.workflow_run_id = f.workflow_run_id
                                                          AND s.task_id = e.task_id LIMIT 1) s
                                    WHERE (s.state || '') = 'skipped' AND s.skip_reason = 'upstream_failed'
                                )
                                SELECT 1 FROM carried x
                                JOIN core_taskdependency e ON e.depends_on_id = x.task_id
                                JOIN core_task k ON k.id = e.task_id
                                CROSS JOIN LATERAL (SELECT h.state, h.started_at, h.finished_at FROM core_taskrun h
                                                    WHERE h.workflow_run_id = f.workflow_run_id
                                                      AND h.task_id = e.task_id LIMIT 1) h
                                WHERE k.trigger_rule IN ('one_failed', 'all_failed') AND (h.state || '') = 'succeeded'
                                  -- A handler marked succeeded by a person (engine.recovery: no
                                  -- start, finished at the mark) handled it too.
                                  AND COALESCE(h.started_at, h.finished_at) >= f.finished_at)) END AS keys,
                               n.cancelled) u
    CROSS JOIN LATERAL (SELECT COALESCE(cardinality(u.keys), 0) AS failed, u.keys, u.cancelled) c
    WHERE o.one IS NULL
), prev AS (
    SELECT r.id, r.state FROM core_workflowrun r JOIN done_runs d ON d.id = r.id
), fin AS (
    UPDATE core_workflowrun r
    SET state = CASE WHEN c.failed > 0 THEN 'failed' WHEN c.cancelled > 0 THEN 'cancelled'
                     ELSE 'succeeded' END,
        finished_at = clock_timestamp(),
        last_event_seq = r.last_event_seq + 1,
        -- "task load failed"; "3 tasks failed: extract, load, notify"; past five keys,
        -- "... and 2 more" (docs/api.md, "A run's final state").
        error = CASE WHEN c.failed = 1 THEN 'task ' || c.keys[1] || ' failed'
                     WHEN c.failed > 1 THEN c.failed || ' tasks failed: ' || array_to_string(c.keys[1:5], ', ')
                                            || CASE WHEN c.failed > 5 THEN ' and ' || (c.failed - 5) || ' more' ELSE '' END
                     ELSE '' END
    FROM done_runs c, prev p
    WHERE r.id = c.id AND p.id = r.id AND r.state IN ('running', 'pending')
    RETURNING r.id, r.organization_id, r.workflow_id, r.state, r.last_event_seq, p.state AS old_state, r.created_at
), ev AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at, run_created_at)
    SELECT gen_random_uuid(), f.organization_id, f.id, NULL, f.last_event_seq, 'run_finished',
           f.old_state, f.state, NULL, NULL, '{}'::jsonb, clock_timestamp(), f.created_at
    FROM fin f
)
-- limited: the run's workflow has max_running_runs, so a queued run may be admitted now
-- (the caller nudges the scheduler, whose tick admits it).
SELECT f.id, f.state, (w.max_running_runs IS NOT NULL) AS limited
FROM fin f JOIN core_workflow w ON w.id = f.workflow_id;


-- name: run_finish_if_done_many
-- run_finish_if_done for the runs of the task runs in ids (the runs a batch of successes touched), except that a done run with a failed task run is left for run_finish_if_done (whether its failures were handled) and returned with a NULL state; core_taskrun_pkey, idx_taskrun_run_state.
-- The hot path's form: main's counts only (index only), no look for a failure handler,
-- whose plan would cost every batch its start-up (task_runs.start_and_complete_many runs
-- run_finish_if_done for the runs it returns; the sweeper's run_list_settled_open, if
-- the process dies first).
WITH runs AS (
    SELECT DISTINCT workflow_run_id AS id FROM core_taskrun WHERE id = ANY(%(ids)s)
), done_runs AS (
    -- One probe of idx_taskrun_run_state per run. LATERAL ... LIMIT 1 keeps it a per-run
    -- probe (as an anti-join the planner may read every open task run of every run). The
    -- open states (pending, ready, running) are the ones between 'failed' and 'skipped',
    -- written as row comparisons, which only idx_taskrun_run_state can use: any condition on
    -- the state alone ("state IN (...)", a state range, even "state > 'failed'") lets a
    -- generic plan made under the statistics of an idle table (nothing open) take
    -- idx_taskrun_state_age (state first), filtered by run, which walked every open task run
    -- of the deployment, other organizations' backlogs included, for each run it asked about.
    -- The run equality and ORDER BY state keep it off uniq_taskrun_per_run_task and a sort of
    -- the whole run. The scan starts at the run's first entry: its cancelled and failed
    -- entries (deduplicated in the index) come before the first open one
    -- (tests/unit/test_hot_statement_plans.py).
    SELECT r.id, c.failed, c.cancelled
    FROM runs r
    LEFT JOIN LATERAL (SELECT 1 AS one FROM core_taskrun t
                       WHERE t.workflow_run_id = r.id
                         AND (t.workflow_run_id, t.state) > (r.id, 'failed')
                         AND (t.workflow_run_id, t.state) < (r.id, 'skipped')
                       ORDER BY t.state LIMIT 1) o ON true
    -- Counted once per run, when it is done: one pass over its task runs.
    CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE t.state = 'failed') AS failed,
                               count(*) FILTER (WHERE t.state = 'cancelled') AS cancelled
                        FROM core_taskrun t WHERE t.workflow_run_id = r.id AND o.one IS NULL) c
    WHERE o.one IS NULL
), prev AS (
    SELECT r.id, r.state FROM core_workflowrun r JOIN done_runs d ON d.id = r.id
), fin AS (
    UPDATE core_workflowrun r
    SET state = CASE WHEN c.failed > 0 THEN 'failed' WHEN c.cancelled > 0 THEN 'cancelled'
                     ELSE 'succeeded' END,
        finished_at = clock_timestamp(),
        last_event_seq = r.last_event_seq + 1,
        error = ''   -- a run with a failed task run is finished by run_finish_if_done
    FROM done_runs c, prev p
    WHERE r.id = c.id AND p.id = r.id AND r.state IN ('running', 'pending') AND c.failed = 0
    RETURNING r.id, r.organization_id, r.workflow_id, r.state, r.last_event_seq, p.state AS old_state, r.created_at
), ev AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at, run_created_at)
    SELECT gen_random_uuid(), f.organization_id, f.id, NULL, f.last_event_seq, 'run_finished',
           f.old_state, f.state, NULL, NULL, '{}'::jsonb, clock_timestamp(), f.created_at
    FROM fin f
)
-- limited: the run's workflow has max_running_runs, so a queued run may be admitted now
-- (the caller nudges the scheduler, whose tick admits it).
SELECT f.id, f.state, (w.max_running_runs IS NOT NULL) AS limited
FROM fin f JOIN core_workflow w ON w.id = f.workflow_id
UNION ALL
SELECT d.id, NULL, false FROM done_runs d WHERE d.failed > 0;


-- name: run_cancel
-- A pending or running run (run) becomes final (cancelled or failed) with reason as its error and a 'run_finished' event; core_workflowrun_pkey. Run after task_run_cancel_open.
WITH prev AS (
    SELECT id, state FROM core_workflowrun WHERE id = %(run)s FOR UPDATE
), fin AS (
    UPDATE core_workflowrun r SET state = %(final)s, finished_at = clock_timestamp(),
           error = %(reason)s, last_event_seq = r.last_event_seq + 1
    FROM prev p
    WHERE r.id = p.id AND r.state IN ('pending', 'running')
    RETURNING r.id, r.organization_id, r.last_event_seq, p.state AS old_state, r.created_at
)
INSERT INTO core_taskrunevent
    (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
     attempt, fencing_token, detail, created_at, run_created_at)
SELECT gen_random_uuid(), f.organization_id, f.id, NULL, f.last_event_seq, 'run_finished', f.old_state,
       %(final)s, NULL, NULL, jsonb_build_object('reason', %(reason)s::text), clock_timestamp(), f.created_at
FROM fin f
RETURNING id;


-- name: run_list_settled_open
-- The ids of up to limit runs still running, older than settle seconds, whose task runs have all finished, oldest first (the sweeper closes them); idx_wfrun_state_age, then idx_taskrun_run_state per run.
SELECT r.id FROM core_workflowrun r
WHERE r.state = 'running' AND r.created_at < clock_timestamp() - make_interval(secs => %(settle)s)
  AND NOT EXISTS (SELECT 1 FROM core_taskrun t WHERE t.workflow_run_id = r.id
                  AND t.state NOT IN ('succeeded', 'failed', 'skipped', 'cancelled'))
ORDER BY r.created_at LIMIT %(limit)s;


-- name: run_list_stalled
-- The ids of up to limit runs still running, older than settle seconds, with a pending task run and none ready or running: nothing will move them (a settle of dependents was lost; the sweeper settles them), oldest first; idx_wfrun_state_age, then idx_taskrun_run_state per run.
SELECT r.id FROM core_workflowrun r
WHERE r.state = 'running' AND r.created_at < clock_timestamp() - make_interval(secs => %(settle)s)
  AND EXISTS (SELECT 1 FROM core_taskrun t WHERE t.workflow_run_id = r.id AND t.state = 'pending')
  AND NOT EXISTS (SELECT 1 FROM core_taskrun t WHERE t.workflow_run_id = r.id AND t.state IN ('ready', 'running'))
ORDER BY r.created_at LIMIT %(limit)s;


-- name: run_list_timed_out
-- Up to limit running runs older than their workflow's run_timeout_seconds (from their start, or from their last resume), with that timeout, oldest first (the sweeper fails them); idx_wfrun_state_age, then core_workflow_pkey.
SELECT r.id, w.run_timeout_seconds FROM core_workflowrun r
JOIN core_workflow w ON w.id = r.workflow_id
WHERE r.state = 'running' AND w.run_timeout_seconds IS NOT NULL
  -- As seconds, not as a timestamp: no run timeout can compute one out of range.
  -- From its start: a run queued behind its workflow's run limit was not running meanwhile;
  -- from its last resume (engine.recovery): it was finished, not running, before it.
  AND EXTRACT(EPOCH FROM clock_timestamp() - coalesce(r.resumed_at, r.started_at, r.created_at))
      > w.run_timeout_seconds
ORDER BY r.created_at LIMIT %(limit)s;
