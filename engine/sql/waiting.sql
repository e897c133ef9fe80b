-- Why ready task runs (and queued runs) are not claimed yet: the wait reasons of issue 16,
-- computed in SQL once, for the API, the run page and the scheduler's 'waiting' events.
--
-- The reasons, first that holds (docs/scheduling.md, "Wait reasons"), each in the words
-- the API and the run page show:
--   retry backoff (not_before in the future)   waiting: retry backoff, 3.2 s
--   the run waits for its workflow's run limit waiting: workflow run limit 2/2
--   concurrency key (running holders >= limit) waiting: concurrency stripe 5/5
--   rate limit (current fixed window full)     waiting: rate limit github 10/10 per second, next window in 0.4 s
--   (or its first half: ceil(limit / 2))       waiting: rate limit github 5/10 per second, 5 in a window's first half, second half in 0.2 s
--   workflow task limit (every version)        waiting: workflow limit 3/3 running tasks
--   organization quota (running task runs)     waiting: organization quota 100/100 running
--   organization's share (dispatched, not      waiting: organization's share of the workers (64 dispatched, not started)
--   started >= FLOWFORGE_DISPATCH_AHEAD x weight)
--   nothing holds it back                      waiting: for a worker
--
-- The reasons are computed in task_run_wait_reasons alone, for the API's read and for the
-- scheduler's note of changes (task_run_waiting_heads, then task_run_note_waiting). It reads the
-- organization's limits the way the fair claim does: each *_override column, else the
-- plan's default from tenancy.limits.plan_table() (parallel arrays; an unknown plan is
-- 'free'). Its counts are served by idx_taskrun_running_org (running task runs per
-- organization and key), a rate bucket by uniq_ratelimit_bucket, and the window is the
-- claim's: the bucket's window opened at window_start and is open for window_seconds.
--
-- task_run_note_waiting appends its events with the CTEs ev_rows, ev_counts, ev_seq and
-- ev_ins of engine/sql/task_runs.sql, written out the same (the file header there).
--
-- Parameters are psycopg's: %(name)s.


-- name: task_run_wait_reasons
-- (task_run_id, reason) for each ready task run of run, or among ids: the first wait reason that holds (file header); idx_taskrun_run_state or core_taskrun_pkey for the rows, idx_taskrun_running_org for the counts, uniq_ratelimit_bucket.
WITH waiting AS (
    SELECT t.id, t.organization_id, t.workflow_run_id, t.task_id, t.attempt, t.fencing_token, t.not_before,
           t.concurrency_key, t.wait_reason
    FROM core_taskrun t
    WHERE t.state = 'ready' AND (t.workflow_run_id = %(run)s::uuid OR t.id = ANY(%(ids)s::uuid[]))
), clock AS (
    SELECT clock_timestamp() AS now
), plans AS (
    SELECT * FROM unnest(%(plan_names)s::text[], %(plan_weights)s::int[], %(plan_max_running)s::int[])
        AS p(name, weight, max_running)
), orgs AS MATERIALIZED (
    -- Once per organization: inlined, the planner counted its running task runs once per
    -- waiting row (200 times; the soak saw 1.9 M buffers and 12 s for one call under load).
    SELECT o.id,
           COALESCE(o.weight_override, p.weight, f.weight) AS weight,
           COALESCE(o.max_running_task_runs_override, p.max_running, f.max_running) AS max_running,
           c.running, c.dispatched
    FROM core_organization o
    LEFT JOIN plans p ON p.name = o.plan
    LEFT JOIN plans f ON f.name = 'free'
    CROSS JOIN LATERAL (
        SELECT count(*) AS running,
               count(*) FILTER (WHERE x.started_fencing_token IS DISTINCT FROM x.fencing_token) AS dispatched
        FROM core_taskrun x
        WHERE x.organization_id = o.id AND x.state = 'running'          -- idx_taskrun_running_org
    ) c
    WHERE o.id IN (SELECT w.organization_id FROM waiting w)
), facts AS (
    SELECT w.id, w.organization_id, w.workflow_run_id, w.attempt, w.fencing_token, w.not_before,
           w.concurrency_key, k.concurrency_limit, k.rate_key, k.rate_limit, k.rate_window_seconds,
           r.state AS run_state, wf.name AS workflow_name, wf.max_running_tasks, wf.max_running_runs
    FROM waiting w
    JOIN core_task k ON k.id = w.task_id
    JOIN core_workflowrun r ON r.id = w.workflow_run_id
    JOIN core_workflow wf ON wf.id = r.workflow_id
), key_counts AS (
    SELECT n.organization_id, n.concurrency_key,
           (SELECT count(*) FROM core_taskrun x
            WHERE x.organization_id = n.organization_id AND x.state = 'running'
              AND x.concurrency_key = n.concurrency_key) AS holders      -- idx_taskrun_running_org
    FROM (SELECT DISTINCT organization_id, concurrency_key FROM facts WHERE concurrency_limit IS NOT NULL) n
), name_counts AS (
    -- Limits count across every version of the workflow's name.
    SELECT n.organization_id, n.workflow_name,
           (SELECT count(*) FROM core_taskrun x
            JOIN core_workflowrun xr ON xr.id = x.workflow_run_id
            JOIN core_workflow xw ON xw.id = xr.workflow_id
            WHERE x.organization_id = n.organization_id AND x.state = 'running'
              AND xw.name = n.workflow_name) AS running_tasks,
           (SELECT count(*) FROM core_workflow xw
            JOIN core_workflowrun xr ON xr.workflow_id = xw.id
            WHERE xw.organization_id = n.organization_id AND xw.name = n.workflow_name
              AND xr.state = 'running') AS running_runs
    FROM (SELECT DISTINCT organization_id, workflow_name FROM facts
          WHERE max_running_tasks IS NOT NULL OR max_running_runs IS NOT NULL) n
), reasons AS (
    SELECT f.id, f.organization_id, f.workflow_run_id, f.attempt, f.fencing_token, CASE
        WHEN f.not_before > c.now THEN
            'waiting: retry backoff, '
            || (ceil(extract(epoch FROM f.not_before - c.now) * 10) / 10)::numeric(12, 1) || ' s'
        WHEN f.run_state = 'pending' AND f.max_running_runs IS NOT NULL THEN
            'waiting: workflow run limit ' || nc.running_runs || '/' || f.max_running_runs
        WHEN kc.holders >= f.concurrency_limit THEN
            'waiting: concurrency ' || f.concurrency_key || ' ' || kc.holders || '/' || f.concurrency_limit
        WHEN b.count >= f.rate_limit THEN
            'waiting: rate limit ' || f.rate_key || ' ' || b.count || '/' || f.rate_limit
            || CASE WHEN f.rate_window_seconds = 1 THEN ' per second' ELSE ' per minute' END
            || ', next window in '
            || (ceil(extract(epoch FROM b.window_start + make_interval(secs => f.rate_window_seconds) - c.now) * 10)
                / 10)::numeric(12, 1) || ' s'
        -- A window's first half admits ceil(limit / 2) (task_run_claim_fair's rate gate).
        WHEN b.count >= (f.rate_limit + 1) / 2
             AND b.window_start + make_interval(secs => f.rate_window_seconds / 2.0) > c.now THEN
            'waiting: rate limit ' || f.rate_key || ' ' || b.count || '/' || f.rate_limit
            || CASE WHEN f.rate_window_seconds = 1 THEN ' per second' ELSE ' per minute' END
            || ', ' || (f.rate_limit + 1) / 2 || ' in a window''s first half, second half in '
            || (ceil(extract(epoch FROM b.window_start + make_interval(secs => f.rate_window_seconds / 2.0) - c.now) * 10)
                / 10)::numeric(12, 1) || ' s'
        WHEN nc.running_tasks >= f.max_running_tasks THEN
            'waiting: workflow limit ' || nc.running_tasks || '/' || f.max_running_tasks || ' running tasks'
        WHEN g.running >= g.max_running THEN
            'waiting: organization quota ' || g.running || '/' || g.max_running || ' running'
        WHEN g.dispatched >= %(dispatch_ahead)s::int * g.weight THEN
            'waiting: organization''s share of the workers (' || g.dispatched || ' dispatched, not started)'
        ELSE 'waiting: for a worker'
    END AS reason
    FROM facts f
    CROSS JOIN clock c
    JOIN orgs g ON g.id = f.organization_id
    LEFT JOIN key_counts kc ON kc.organization_id = f.organization_id AND kc.concurrency_key = f.concurrency_key
    LEFT JOIN name_counts nc ON nc.organization_id = f.organization_id AND nc.workflow_name = f.workflow_name
    LEFT JOIN core_ratelimitbucket b                                     -- uniq_ratelimit_bucket
        ON b.organization_id = f.organization_id AND b.key = f.rate_key
       AND b.window_seconds = f.rate_window_seconds
       AND b.window_start + make_interval(secs => b.window_seconds) > c.now   -- its window is open
)
SELECT r.id, r.reason FROM reasons r
ORDER BY r.id;


-- name: task_run_waiting_heads
-- The ids of at most limit ready task runs of the shared workers (queue '') that the scheduler notes the wait reasons of: the head of each organization's queue in claim order, an equal share each (a loose index scan for the organizations, then idx_taskrun_ready_claim per organization).
WITH RECURSIVE ready_orgs AS (
    -- The organizations with ready work, one index probe each (a loose index scan).
    (SELECT t.organization_id AS org FROM core_taskrun t WHERE t.state = 'ready' AND t.queue = ''
     ORDER BY t.organization_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.organization_id FROM core_taskrun t
            WHERE t.state = 'ready' AND t.queue = '' AND t.organization_id > o.org
            ORDER BY t.organization_id LIMIT 1)
    FROM ready_orgs o WHERE o.org IS NOT NULL
), share AS (
    SELECT greatest(1, %(limit)s::int / greatest(1, count(*)))::int AS n FROM ready_orgs WHERE org IS NOT NULL
)
SELECT h.id FROM ready_orgs o CROSS JOIN share s CROSS JOIN LATERAL (
    SELECT t.id FROM core_taskrun t
    WHERE t.queue = '' AND t.organization_id = o.org AND t.state = 'ready'
    ORDER BY t.priority DESC, t.created_at                               -- idx_taskrun_ready_claim
    LIMIT s.n
) h
WHERE o.org IS NOT NULL
LIMIT %(limit)s::int;


-- name: task_run_note_waiting
-- For the ready task runs in ids whose stored reason (stored, computed by task_run_wait_reasons) differs from their wait_reason, set it and append a 'waiting' event (detail.reason: reasons) unless it is ''; core_taskrun_pkey. Returns (changed, events).
WITH changed AS (
    SELECT a.id, a.reason, a.stored
    FROM unnest(%(ids)s::uuid[], %(reasons)s::text[], %(stored)s::text[]) AS a(id, reason, stored)
    JOIN core_taskrun t ON t.id = a.id
    WHERE (t.state || '') = 'ready' AND a.stored <> t.wait_reason         -- by primary key (task_runs.sql header)
), locked AS (
    -- A row a claim holds is being claimed: skipped, not waited for (and no lock-order
    -- cycle with a claim: rows first, in id order, the run rows last in ev_seq).
    SELECT t.id FROM core_taskrun t
    WHERE t.id IN (SELECT c.id FROM changed c) AND (t.state || '') = 'ready'   -- by primary key (task_runs.sql header)
    ORDER BY t.id
    FOR UPDATE SKIP LOCKED
), noted AS (
    UPDATE core_taskrun t SET wait_reason = c.stored
    FROM changed c JOIN locked l ON l.id = c.id
    WHERE t.id = c.id
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, c.reason, c.stored
), tr AS (
    -- An event when a task run is newly held back, or held back by something else; none
    -- when it is free again (its claim follows).
    SELECT n.*, 'waiting'::text AS ev_kind, 'ready'::text AS ev_from, 'ready'::text AS ev_to,
           jsonb_build_object('reason', n.reason) AS ev_detail
    FROM noted n WHERE n.stored <> ''
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
SELECT (SELECT count(*) FROM noted), (SELECT count(*) FROM tr);


-- name: run_wait_reasons
-- (run_id, reason) for each pending run among ids held by its workflow's run limit: running runs of the workflow's name (every version) / max_running_runs; core_workflowrun_pkey, then the name's versions (uniq on organization, name, version) and their runs (idx_wfrun_wf_recent).
SELECT r.id,
       'waiting: workflow run limit '
       || (SELECT count(*) FROM core_workflow xw
           JOIN core_workflowrun xr ON xr.workflow_id = xw.id
           WHERE xw.organization_id = wf.organization_id AND xw.name = wf.name AND xr.state = 'running')
       || '/' || wf.max_running_runs AS reason
FROM core_workflowrun r
JOIN core_workflow wf ON wf.id = r.workflow_id
WHERE r.id = ANY(%(ids)s::uuid[]) AND r.state = 'pending' AND wf.max_running_runs IS NOT NULL;
