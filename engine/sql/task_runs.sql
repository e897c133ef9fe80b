-- Statements that change task runs (core_taskrun), each with the events it appends.
--
-- Every transition bumps each touched run's event counter (core_workflowrun.last_event_seq)
-- once and numbers its events from it in the CTEs ev_rows, ev_counts, ev_seq and ev_ins,
-- written out the same in every statement (tests/unit/test_sql_statements.py checks that):
-- the last write of the statement, so the run row is locked last.
--
-- Statements that address task runs by id state their state precondition as
-- (t.state || '') = 'running': the same test, in a form no index and no partial index
-- predicate matches, so the planner can only find the rows by primary key
-- (core_taskrun_pkey). Written plainly, a plan built while statistics said "5 running
-- rows" (a queue's counts swing far faster than ANALYZE follows, and a prepared statement
-- keeps its plan) scans every running row of the table (idx_taskrun_lease_expiry), or
-- every succeeded row in history (idx_taskrun_state_age), once per batch.
--
-- Parameters are psycopg's: %(name)s.


-- name: task_run_insert_for_run
-- A new run's task runs, one per task of its workflow: roots ready from now (ready_at), the rest pending, all pending when held (a run queued behind its workflow's run limit); priority = the run's (priority) + the task's; concurrency_key = keys->>task key (rendered from the run input by the caller; NULL without one); the task's queue; attempt 1, token 0; uniq_task_workflow_key (the workflow's tasks, by key).
INSERT INTO core_taskrun
    (id, organization_id, workflow_run_id, task_id, state, attempt, fencing_token, error, created_at,
     priority, concurrency_key, ready_at, queue)
SELECT gen_random_uuid(), t.organization_id, %(run)s, t.id, s.state, 1, 0, '', clock_timestamp(),
       %(priority)s + t.priority, %(keys)s::jsonb ->> t.key,
       CASE WHEN s.state = 'ready' THEN clock_timestamp() END, t.queue
FROM core_task t
CROSS JOIN LATERAL (
    SELECT CASE WHEN %(held)s OR EXISTS (SELECT 1 FROM core_taskdependency d WHERE d.task_id = t.id)
                THEN 'pending' ELSE 'ready' END AS state
) s
WHERE t.workflow_id = %(wf)s
ORDER BY t.key;


-- name: task_run_ready_of_runs
-- The ids of the ready task runs of the shared workers (queue '') of the runs in runs, oldest first (new runs' roots: a start's own claim, and the claim after a caller's commit); idx_taskrun_run_state.
SELECT id FROM core_taskrun
WHERE workflow_run_id = ANY(%(runs)s::uuid[]) AND state = 'ready' AND queue = ''   -- idx_taskrun_run_state
ORDER BY created_at
LIMIT %(limit)s;


-- name: task_run_ready_orgs_of
-- The organizations of the task runs in ids that have a ready task run of the shared workers (queue ''), ascending (read only, no lock: a refill's check before it takes any claim lock); core_taskrun_pkey, then one probe of idx_taskrun_ready_claim each.
SELECT o.organization_id
FROM (SELECT DISTINCT organization_id FROM core_taskrun WHERE id = ANY(%(ids)s::uuid[])) o
WHERE EXISTS (SELECT 1 FROM core_taskrun t
              WHERE t.queue = '' AND t.organization_id = o.organization_id AND t.state = 'ready')
ORDER BY 1;


-- name: task_run_ready_orgs_after
-- Up to max_orgs organizations with ready task runs of the shared workers (queue '') whose id sorts after the cursor, ascending (a loose index scan: one probe of idx_taskrun_ready_claim each); idx_taskrun_ready_claim.
WITH RECURSIVE o(id) AS (
    (SELECT organization_id FROM core_taskrun
     WHERE state = 'ready' AND queue = '' AND organization_id > %(after)s::uuid
     ORDER BY organization_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.organization_id FROM core_taskrun t
            WHERE t.state = 'ready' AND t.queue = '' AND t.organization_id > o.id
            ORDER BY t.organization_id LIMIT 1)
    FROM o WHERE o.id IS NOT NULL
)
SELECT id FROM o WHERE id IS NOT NULL LIMIT %(max_orgs)s;


-- name: task_run_lock_orgs
-- The claim locks of the organizations in orgs, for this transaction (pg_advisory_xact_lock, ascending key); no table.
-- The lock is the claim's correctness argument: under it, the claim that follows (a new
-- statement, so a new snapshot) counts the organization's running task runs, permits and
-- rate buckets exactly, and no other claimer of that organization can slip between.
-- Every claimer takes its organizations' locks first, before any row lock, in ascending
-- key order (the ORDER BY runs before the volatile lock calls), so claimers never deadlock.
SELECT o.id, pg_advisory_xact_lock(hashtextextended('flowforge.claim:' || o.id::text, 0)) IS NULL
FROM unnest(%(orgs)s::uuid[]) AS o(id)
ORDER BY hashtextextended('flowforge.claim:' || o.id::text, 0);


-- name: task_run_lock_orgs_of
-- The organizations of the task runs in lock_ids, each locked for this transaction's claim as in task_run_lock_orgs (ascending key); core_taskrun_pkey.
SELECT o.id, pg_advisory_xact_lock(hashtextextended('flowforge.claim:' || o.id::text, 0)) IS NULL
FROM (SELECT DISTINCT organization_id AS id FROM core_taskrun WHERE id = ANY(%(lock_ids)s::uuid[])) o
ORDER BY hashtextextended('flowforge.claim:' || o.id::text, 0);


-- name: task_run_claim_fair
-- The fair claim: up to limit ready task runs of the queue claim_queue ('' for the shared workers, else an organization's own workers' queue) of the organizations in orgs and of the task runs in org_of (locked first: task_run_lock_*), weighted round robin between organizations, highest priority then oldest within one, gated by room, permits, workflow limits and rate buckets; ready -> running (token + 1, dispatch lease), one outbox row on its lane (the shared workers' only) and a 'claimed' event each; idx_taskrun_ready_claim, idx_taskrun_running_org, uniq_ratelimit_bucket, uniq_outbox_per_taskrun_generation.
-- Gates (issue 16; seed 001's semaphores and rate buckets):
--   room     an organization's claimed-not-started generations stay under ahead x weight
--            (the broker holds that much of its backlog at most, ahead of anyone else's),
--            and its running task runs (claimed or started) under its max_running_task_runs;
--   permits  a task run holds one of its concurrency key's permits while it is running
--            (the running rows ARE the holders: every transition out of running, the
--            reaper's included, releases it, so a crashed worker cannot leak one);
--   workflow running task runs of a workflow name under its max_running_tasks;
--   rate     claims in a bucket's open window under its limit, counted by one upsert per
--            bucket; a window opens at the first claim after the last one closed and is
--            open for window_seconds, and its first half admits at most ceil(limit / 2)
--            (fixed windows, split: never more than limit in one window, under 2 x limit
--            across a boundary, and claim i of a backlog (from 0) comes at least
--            floor(i / limit) windows, plus half a window when i mod limit >=
--            ceil(limit / 2), after the first: 100 at 10 a second span >= 9.5 s).
-- Refill: a worker batch claims (refill > 0) only for an organization whose claimed-not-
-- started backlog is at most (ahead - refill) x weight.
-- Lanes: an organization's first first x weight generations waiting for a worker go to
-- first_queue (a Dramatiq actor of higher priority: ahead of every bulk backlog), the rest
-- to queue, so another organization's backlog never stands in front of its first task.
-- Rows a full key, workflow or bucket holds back are skipped in the index scan, so they do
-- not block the rows behind them. A row a partly full gate turns away can cost another row
-- its place in this pass (never a limit): the next claim takes it.
WITH now_ AS (
    SELECT clock_timestamp() AS at
), plan AS (
    SELECT * FROM unnest(%(plan_names)s::text[], %(plan_weights)s::int[], %(plan_max_running)s::int[])
        AS p(name, weight, max_running)
), org AS (
    -- Each organization's weight and quota: its override, else its plan's ('free' for a plan not listed).
    SELECT o.id,
           COALESCE(o.weight_override, p.weight, f.weight, 1)::int AS weight,
           COALESCE(o.max_running_task_runs_override, p.max_running, f.max_running)::int AS max_running
    FROM core_organization o
    LEFT JOIN plan p ON p.name = o.plan
    LEFT JOIN plan f ON f.name = 'free'
    WHERE o.id IN (SELECT unnest(%(orgs)s::uuid[])
                   UNION SELECT organization_id FROM core_taskrun WHERE id = ANY(%(org_of)s::uuid[]))
), room AS (
    SELECT org.id, org.weight, u.dispatched,
           LEAST(org.max_running - u.running, %(ahead)s::int * org.weight - u.dispatched) AS room
    FROM org CROSS JOIN LATERAL (
        SELECT count(*) AS running,
               count(*) FILTER (WHERE t.started_fencing_token IS DISTINCT FROM t.fencing_token) AS dispatched
        FROM core_taskrun t
        WHERE t.organization_id = org.id AND t.state = 'running'     -- idx_taskrun_running_org
    ) u
), held AS (
    -- Permits held: running task runs per (organization, concurrency key); idx_taskrun_running_org.
    SELECT t.organization_id, t.concurrency_key, count(*) AS n
    FROM core_taskrun t JOIN org ON org.id = t.organization_id
    WHERE t.state = 'running' AND t.concurrency_key IS NOT NULL
    GROUP BY 1, 2
), limited AS (
    -- Workflow names with a max_running_tasks in some version.
    SELECT DISTINCT w.organization_id, w.name
    FROM core_workflow w JOIN org ON org.id = w.organization_id
    WHERE w.max_running_tasks IS NOT NULL
), wf_held AS (
    -- Running task runs per limited workflow name (every version); nothing to count without one.
    SELECT w.organization_id, w.name, count(*) AS n
    FROM core_taskrun t
    JOIN core_task k ON k.id = t.task_id
    JOIN core_workflow w ON w.id = k.workflow_id
    JOIN limited l ON l.organization_id = w.organization_id AND l.name = w.name
    WHERE t.organization_id IN (SELECT organization_id FROM limited) AND t.state = 'running'
      AND EXISTS (SELECT 1 FROM limited)
    GROUP BY 1, 2
), bucket AS (
    -- Each rate bucket whose window is still open, with its count and whether the window
    -- is in its first half (capped at ceil(limit / 2)); uniq_ratelimit_bucket.
    SELECT b.organization_id, b.key, b.window_seconds, b.count,
           b.window_start + make_interval(secs => b.window_seconds / 2.0) > now_.at AS first_half
    FROM core_ratelimitbucket b JOIN org ON org.id = b.organization_id, now_
    WHERE b.window_start + make_interval(secs => b.window_seconds) > now_.at
), cand AS (
    SELECT c.*, room.weight, room.room, room.dispatched
    FROM room CROSS JOIN LATERAL (
        SELECT t.id, t.organization_id, t.priority, t.created_at, t.concurrency_key, t.ready_at, t.not_before,
               k.concurrency_limit, k.rate_key, k.rate_limit, k.rate_window_seconds,
               w.name AS wf_name, w.max_running_tasks
        FROM core_taskrun t
        JOIN core_task k ON k.id = t.task_id
        JOIN core_workflow w ON w.id = k.workflow_id
        WHERE t.queue = %(claim_queue)s AND t.organization_id = room.id AND t.state = 'ready'  -- idx_taskrun_ready_claim
          AND (t.not_before IS NULL OR t.not_before <= (SELECT at FROM now_))
          AND (%(only_ids)s::uuid[] IS NULL OR t.id = ANY(%(only_ids)s::uuid[]))
          AND NOT EXISTS (SELECT 1 FROM held h WHERE h.organization_id = t.organization_id
                          AND h.concurrency_key = t.concurrency_key AND h.n >= k.concurrency_limit)
          AND NOT EXISTS (SELECT 1 FROM wf_held x WHERE x.organization_id = t.organization_id
                          AND x.name = w.name AND x.n >= w.max_running_tasks)
          AND NOT EXISTS (SELECT 1 FROM bucket b WHERE b.organization_id = t.organization_id
                          AND b.key = k.rate_key AND b.window_seconds = k.rate_window_seconds
                          AND b.count >= CASE WHEN b.first_half THEN (k.rate_limit + 1) / 2
                                              ELSE k.rate_limit END)
        ORDER BY t.priority DESC, t.created_at
        LIMIT GREATEST(room.room, 0) + %(lookahead)s::int
        FOR UPDATE OF t SKIP LOCKED
    ) c
    WHERE room.room > 0
      -- A refill (a worker batch's claim) only once the organization's broker backlog has
      -- run down by refill x weight: claiming one generation per start would cost a claim
      -- per task, and the backlog keeps the workers busy meanwhile. The scheduler passes 0.
      AND room.dispatched <= (%(ahead)s::int - %(refill)s::int) * room.weight
), ranked AS (
    SELECT c.*,
           row_number() OVER (PARTITION BY c.organization_id, c.concurrency_key
                              ORDER BY c.priority DESC, c.created_at, c.id) AS key_rn,
           row_number() OVER (PARTITION BY c.organization_id, c.wf_name
                              ORDER BY c.priority DESC, c.created_at, c.id) AS wf_rn,
           row_number() OVER (PARTITION BY c.organization_id, c.rate_key, c.rate_window_seconds
                              ORDER BY c.priority DESC, c.created_at, c.id) AS rate_rn
    FROM cand c
), eligible AS (
    SELECT r.*,
           row_number() OVER (PARTITION BY r.organization_id ORDER BY r.priority DESC, r.created_at, r.id) AS org_rn
    FROM ranked r
    LEFT JOIN held h ON h.organization_id = r.organization_id AND h.concurrency_key = r.concurrency_key
    LEFT JOIN wf_held x ON x.organization_id = r.organization_id AND x.name = r.wf_name
    LEFT JOIN bucket b ON b.organization_id = r.organization_id AND b.key = r.rate_key
                      AND b.window_seconds = r.rate_window_seconds
    WHERE (r.concurrency_key IS NULL OR r.key_rn <= r.concurrency_limit - COALESCE(h.n, 0))
      AND (r.max_running_tasks IS NULL OR r.wf_rn <= r.max_running_tasks - COALESCE(x.n, 0))
      -- No open window: this claim opens one, in its first half.
      AND (r.rate_key IS NULL
           OR r.rate_rn <= CASE WHEN COALESCE(b.first_half, true) THEN (r.rate_limit + 1) / 2
                                ELSE r.rate_limit END - COALESCE(b.count, 0))
), picked AS (
    SELECT e.* FROM eligible e
    WHERE e.org_rn <= e.room
    -- Weighted round robin between organizations: an organization's n-th pick at n / weight.
    ORDER BY e.org_rn::float8 / e.weight, e.created_at, e.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE core_taskrun t
    SET state = 'running', fencing_token = t.fencing_token + 1, lease_owner = %(owner)s,
        lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s), not_before = NULL,
        wait_reason = ''
    FROM picked
    WHERE t.id = picked.id AND (t.state || '') = 'ready'      -- by primary key (file header)
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token,
              picked.rate_key, picked.rate_window_seconds,
              CASE WHEN picked.dispatched + picked.org_rn <= %(first)s::int * picked.weight
                   THEN %(first_queue)s ELSE %(queue)s END AS lane,
              -- Seconds it waited to be claimed, from when it became claimable.
              EXTRACT(EPOCH FROM clock_timestamp()
                      - COALESCE(GREATEST(picked.ready_at, picked.not_before), picked.created_at)) AS waited,
              -- Its place in picked's order (RETURNING keeps no order): the publish follows it.
              picked.org_rn::float8 / picked.weight AS turn, picked.created_at AS made
), rate_count AS (
    -- One upsert per bucket (seed 001): the claims of this statement, counted in the
    -- bucket's open window, or in a new window opening now once the last one has closed.
    INSERT INTO core_ratelimitbucket AS b (organization_id, key, window_seconds, window_start, count)
    SELECT c.organization_id, c.rate_key, c.rate_window_seconds, n.at, count(*)
    FROM claimed c, now_ n
    WHERE c.rate_key IS NOT NULL
    GROUP BY 1, 2, 3, 4
    ON CONFLICT ON CONSTRAINT uniq_ratelimit_bucket DO UPDATE SET
        count = CASE WHEN b.window_start + make_interval(secs => b.window_seconds) > EXCLUDED.window_start
                     THEN b.count + EXCLUDED.count ELSE EXCLUDED.count END,
        window_start = CASE WHEN b.window_start + make_interval(secs => b.window_seconds) > EXCLUDED.window_start
                            THEN b.window_start ELSE EXCLUDED.window_start END
), outbox AS (
    INSERT INTO core_outboxmessage
        (id, organization_id, task_run_id, workflow_run_id, exchange, routing_key, payload,
         fencing_token_snapshot, attempt_snapshot, publish_attempts, last_error, created_at, next_attempt_at)
    SELECT gen_random_uuid(), c.organization_id, c.id, c.workflow_run_id, '', c.lane,
           jsonb_build_object('task_run_id', c.id, 'fencing_token', c.fencing_token, 'attempt', c.attempt,
                              'workflow_run_id', c.workflow_run_id, 'organization_id', c.organization_id),
           c.fencing_token, c.attempt, 0, '', clock_timestamp(),
           -- Reserved for the claimer's own publish right after its commit: the relay's
           -- drain leaves the row alone until then (see engine.relay.publish_claimed).
           CASE WHEN %(reserve)s::float8 > 0
                THEN clock_timestamp() + make_interval(secs => %(reserve)s::float8) END
    FROM claimed c
    -- A worker queue's generations are handed to the poll that claimed them, not published.
    WHERE %(claim_queue)s::text = ''
    -- uniq_outbox_per_taskrun_generation picks the winner of a race; the loser writes nothing.
    ON CONFLICT ON CONSTRAINT uniq_outbox_per_taskrun_generation DO NOTHING
    RETURNING id, task_run_id
), tr AS (
    SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token,
           'claimed'::text AS ev_kind, 'ready'::text AS ev_from, 'running'::text AS ev_to,
           jsonb_build_object('lease_owner', %(owner)s::text) AS ev_detail
    FROM claimed c
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
           -- The claim's instant, the one its rate buckets counted it at: a timeline read
           -- from these events sees the buckets' windows exactly.
           e.ev_from, e.ev_to, e.attempt, e.fencing_token, e.ev_detail, n.at, s.run_created_at
    FROM ev_rows e JOIN ev_seq s ON s.id = e.workflow_run_id, now_ n
)
-- A row per claimed generation (with the seconds it waited, its lane, its place in the claim's order and whether it
-- counted into a rate bucket), then a row per outbox row written (joined in Python: as a join here, planned with
-- nested loops only, it would compare every pair).
SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token, NULL::uuid, c.waited, c.lane,
       c.turn, c.made, c.rate_key IS NOT NULL
FROM claimed c
UNION ALL
SELECT o.task_run_id, NULL, NULL, NULL, NULL, o.id, NULL, NULL, NULL, NULL, NULL FROM outbox o;


-- name: task_run_start_many
-- Start generations (start_ids, start_tokens, owners, start_outbox): at most one start per generation, the worker lease, a 'started' event each, and what the worker needs; core_taskrun_pkey, uniq_outbox_per_taskrun_generation.
WITH sreq AS (
    -- One instant per start (at): started_at and the lease are both counted from it, so a
    -- lease that ends at the timeout is exactly started_at + timeout_seconds (expire_lease).
    SELECT a.*, clock_timestamp() AS at
    FROM unnest(%(start_ids)s::uuid[], %(start_tokens)s::bigint[], %(owners)s::text[],
                %(start_outbox)s::uuid[]) AS a(id, token, owner, outbox_id)
), started AS (
    UPDATE core_taskrun t
    SET started_fencing_token = t.fencing_token, started_at = sreq.at, finished_at = NULL,
        lease_owner = sreq.owner,
        -- The worker's lease, or the task's timeout when that is shorter (LEAST inside, so
        -- a timeout of any size never makes a timestamp out of PostgreSQL's range).
        lease_expires_at = sreq.at + make_interval(
            secs => LEAST(COALESCE(k.timeout_seconds, %(worker_lease)s), %(worker_lease)s))
    FROM core_task k, sreq
    WHERE t.id = sreq.id AND k.id = t.task_id
      AND (t.state || '') = 'running' AND t.fencing_token = sreq.token   -- by primary key (file header)
      AND t.started_fencing_token IS DISTINCT FROM sreq.token   -- at most one start per generation
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id,
              k.key, k.type, k.config, k.max_attempts + t.attempt_base AS max_attempts, k.timeout_seconds, sreq.owner, sreq.outbox_id,
              k.condition
), delivered AS (
    -- A continuation (StartRequest.outbox_id): its outbox row, reserved for the thread
    -- that claimed it and never published, is stamped as delivered by its start.
    UPDATE core_outboxmessage o
    SET published_at = clock_timestamp(), publish_attempts = o.publish_attempts + 1, next_attempt_at = NULL
    FROM started s
    -- By primary key: "published_at IS NULL" written plainly matches idx_outbox_pending's
    -- predicate, and the generic plan read every pending row, and every index entry an
    -- earlier stamp left dead, once per batch, a continuation in it or not (EXPLAIN
    -- ANALYZE: 7.7 of a batch's 9.4 ms beside 4,000 pending rows).
    WHERE o.id = s.outbox_id AND COALESCE(o.published_at, 'infinity') = 'infinity'
), tr AS (
    SELECT s.id, s.workflow_run_id, s.organization_id, s.attempt, s.fencing_token, 1 AS ev_ord,
           'started'::text AS ev_kind, 'running'::text AS ev_from, 'running'::text AS ev_to,
           jsonb_build_object('worker', s.owner) AS ev_detail
    FROM started s
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
-- What a worker needs to run each started attempt (StartedAttempt's fields, in order).
SELECT s.id, s.workflow_run_id, s.organization_id, s.key, s.type, s.config, s.attempt, s.max_attempts,
       s.fencing_token, s.timeout_seconds, r.input,
       -- Dependency outputs by key, whole while their running total of JSON bytes (by key)
       -- fits upstream_bytes; each one past it as a summary (StartedAttempt.upstream).
       COALESCE((SELECT jsonb_object_agg(x.key, CASE WHEN x.total <= %(upstream_bytes)s::bigint THEN x.output
                    ELSE jsonb_build_object('$ref', 'task_output', 'task', x.key, 'bytes', x.bytes,
                                            'truncated', true) END)
                 -- A dependency that did not succeed (a trigger rule other than all_success) has no
                 -- output (SQL NULL): handed as JSON null.
                 FROM (SELECT uk.key, COALESCE(u.output, 'null'::jsonb) AS output,
                              octet_length(COALESCE(u.output, 'null'::jsonb)::text) AS bytes,
                              sum(octet_length(COALESCE(u.output, 'null'::jsonb)::text)) OVER (ORDER BY uk.key) AS total
                       FROM core_taskdependency d                   -- uniq_taskdep_edge
                       JOIN core_task uk ON uk.id = d.depends_on_id
                       -- One probe by (run, task) per edge (one entry of
                       -- uniq_taskrun_per_run_task or idx_taskrun_task_run). As a plain join the
                       -- generic plan could walk the whole run's task runs for every start
                       -- (measured: 3.8 ms and 12,000 buffers per start in a run of 2,000);
                       -- the LIMIT keeps the subquery from being flattened into one.
                       CROSS JOIN LATERAL (SELECT r.output FROM core_taskrun r
                                           WHERE r.workflow_run_id = s.workflow_run_id
                                             AND r.task_id = d.depends_on_id
                                           LIMIT 1) u
                       WHERE d.task_id = s.task_id) x), '{}'::jsonb),
       -- uniq_outbox_per_taskrun_generation: this generation's outbox row, written by its claim
       -- (created_at: the claim's instant), for the dispatch-latency metric; NULL for a worker
       -- queue's generation (no outbox row). Not the 'claimed' event: core_taskrunevent is
       -- partitioned, and this statement's generic plan set up a probe of every partition on
       -- each call (measured in make bench's throughput scenario: 7% of PostgreSQL's CPU).
       EXTRACT(EPOCH FROM clock_timestamp() - (
           SELECT o.created_at FROM core_outboxmessage o
           WHERE o.task_run_id = s.id AND o.fencing_token_snapshot = s.fencing_token)),
       EXISTS (SELECT 1 FROM core_taskdependency x WHERE x.depends_on_id = s.task_id),
       -- Its condition ('' for none): the worker evaluates it before the handler (engine.conditions).
       s.condition,
       -- A cron run's instant and data interval (StartedAttempt.schedule; NULLs otherwise).
       r.scheduled_for, r.data_interval_start, r.data_interval_end
FROM started s JOIN core_workflowrun r ON r.id = s.workflow_run_id;


-- name: task_run_succeed_many
-- Succeed started generations (ids, tokens, outputs as JSON text) with a 'succeeded' event each; core_taskrun_pkey.
WITH creq AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[], %(outputs)s::text[]) AS a(id, token, output)
), done AS (
    UPDATE core_taskrun t
    SET state = 'succeeded', output = creq.output::jsonb, error = '', finished_at = clock_timestamp(),
        lease_owner = NULL, lease_expires_at = NULL, not_before = NULL
    FROM creq
    WHERE t.id = creq.id AND (t.state || '') = 'running' AND t.fencing_token = creq.token   -- by primary key
      AND t.started_fencing_token = creq.token
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id, t.state
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token, 0 AS ev_ord,
           'succeeded'::text AS ev_kind, 'running'::text AS ev_from, 'succeeded'::text AS ev_to,
           '{}'::jsonb AS ev_detail
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
SELECT id, fencing_token, workflow_run_id, state FROM done;


-- name: task_run_start_and_succeed_many
-- task_run_succeed_many and task_run_start_many as one statement (the run rows locked once, after both UPDATEs; successes' events first); core_taskrun_pkey, uniq_outbox_per_taskrun_generation.
-- Never the same row in both UPDATEs: a success needs the generation started, a start needs it not started.
WITH sreq AS (
    -- One instant per start (at): started_at and the lease are both counted from it, so a
    -- lease that ends at the timeout is exactly started_at + timeout_seconds (expire_lease).
    SELECT a.*, clock_timestamp() AS at
    FROM unnest(%(start_ids)s::uuid[], %(start_tokens)s::bigint[], %(owners)s::text[],
                %(start_outbox)s::uuid[]) AS a(id, token, owner, outbox_id)
), started AS (
    UPDATE core_taskrun t
    SET started_fencing_token = t.fencing_token, started_at = sreq.at, finished_at = NULL,
        lease_owner = sreq.owner,
        -- The worker's lease, or the task's timeout when that is shorter (LEAST inside, so
        -- a timeout of any size never makes a timestamp out of PostgreSQL's range).
        lease_expires_at = sreq.at + make_interval(
            secs => LEAST(COALESCE(k.timeout_seconds, %(worker_lease)s), %(worker_lease)s))
    FROM core_task k, sreq
    WHERE t.id = sreq.id AND k.id = t.task_id
      AND (t.state || '') = 'running' AND t.fencing_token = sreq.token   -- by primary key (file header)
      AND t.started_fencing_token IS DISTINCT FROM sreq.token   -- at most one start per generation
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id,
              k.key, k.type, k.config, k.max_attempts + t.attempt_base AS max_attempts, k.timeout_seconds, sreq.owner, sreq.outbox_id,
              k.condition
), delivered AS (
    -- A continuation (StartRequest.outbox_id): its outbox row, reserved for the thread
    -- that claimed it and never published, is stamped as delivered by its start.
    UPDATE core_outboxmessage o
    SET published_at = clock_timestamp(), publish_attempts = o.publish_attempts + 1, next_attempt_at = NULL
    FROM started s
    -- By primary key: "published_at IS NULL" written plainly matches idx_outbox_pending's
    -- predicate, and the generic plan read every pending row, and every index entry an
    -- earlier stamp left dead, once per batch, a continuation in it or not (EXPLAIN
    -- ANALYZE: 7.7 of a batch's 9.4 ms beside 4,000 pending rows).
    WHERE o.id = s.outbox_id AND COALESCE(o.published_at, 'infinity') = 'infinity'
), creq AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[], %(outputs)s::text[]) AS a(id, token, output)
), done AS (
    UPDATE core_taskrun t
    SET state = 'succeeded', output = creq.output::jsonb, error = '', finished_at = clock_timestamp(),
        lease_owner = NULL, lease_expires_at = NULL, not_before = NULL
    FROM creq
    WHERE t.id = creq.id AND (t.state || '') = 'running' AND t.fencing_token = creq.token   -- by primary key
      AND t.started_fencing_token = creq.token
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id, t.state
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token, 0 AS ev_ord,
           'succeeded'::text AS ev_kind, 'running'::text AS ev_from, 'succeeded'::text AS ev_to,
           '{}'::jsonb AS ev_detail
    FROM done d
    UNION ALL
    SELECT s.id, s.workflow_run_id, s.organization_id, s.attempt, s.fencing_token, 1 AS ev_ord,
           'started'::text AS ev_kind, 'running'::text AS ev_from, 'running'::text AS ev_to,
           jsonb_build_object('worker', s.owner) AS ev_detail
    FROM started s
), ev_rows AS (
    SELECT tr.*, row_number() OVER (PARTITION BY tr.workflow_run_id ORDER BY tr.ev_ord, tr.id) AS rn
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
-- ('d', id, workflow_run_id, state at [4], fencing_token at [9]) per success, padded with
-- NULLs to the starts' width, then ('s', task_run_start_many's row) per start.
SELECT 'd', d.id, d.workflow_run_id, NULL, d.state, NULL, NULL, NULL, NULL, d.fencing_token,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM done d
UNION ALL
SELECT 's', s.id, s.workflow_run_id, s.organization_id, s.key, s.type, s.config, s.attempt, s.max_attempts,
       s.fencing_token, s.timeout_seconds, r.input,
       -- Dependency outputs by key, whole while their running total of JSON bytes (by key)
       -- fits upstream_bytes; each one past it as a summary (StartedAttempt.upstream).
       COALESCE((SELECT jsonb_object_agg(x.key, CASE WHEN x.total <= %(upstream_bytes)s::bigint THEN x.output
                    ELSE jsonb_build_object('$ref', 'task_output', 'task', x.key, 'bytes', x.bytes,
                                            'truncated', true) END)
                 -- A dependency that did not succeed (a trigger rule other than all_success) has no
                 -- output (SQL NULL): handed as JSON null.
                 FROM (SELECT uk.key, COALESCE(u.output, 'null'::jsonb) AS output,
                              octet_length(COALESCE(u.output, 'null'::jsonb)::text) AS bytes,
                              sum(octet_length(COALESCE(u.output, 'null'::jsonb)::text)) OVER (ORDER BY uk.key) AS total
                       FROM core_taskdependency d                   -- uniq_taskdep_edge
                       JOIN core_task uk ON uk.id = d.depends_on_id
                       -- One probe by (run, task) per edge (one entry of
                       -- uniq_taskrun_per_run_task or idx_taskrun_task_run). As a plain join the
                       -- generic plan could walk the whole run's task runs for every start
                       -- (measured: 3.8 ms and 12,000 buffers per start in a run of 2,000);
                       -- the LIMIT keeps the subquery from being flattened into one.
                       CROSS JOIN LATERAL (SELECT r.output FROM core_taskrun r
                                           WHERE r.workflow_run_id = s.workflow_run_id
                                             AND r.task_id = d.depends_on_id
                                           LIMIT 1) u
                       WHERE d.task_id = s.task_id) x), '{}'::jsonb),
       -- uniq_outbox_per_taskrun_generation: this generation's outbox row, written by its claim
       -- (created_at: the claim's instant), for the dispatch-latency metric; NULL for a worker
       -- queue's generation (no outbox row). Not the 'claimed' event: core_taskrunevent is
       -- partitioned, and this statement's generic plan set up a probe of every partition on
       -- each call (measured in make bench's throughput scenario: 7% of PostgreSQL's CPU).
       EXTRACT(EPOCH FROM clock_timestamp() - (
           SELECT o.created_at FROM core_outboxmessage o
           WHERE o.task_run_id = s.id AND o.fencing_token_snapshot = s.fencing_token)),
       EXISTS (SELECT 1 FROM core_taskdependency x WHERE x.depends_on_id = s.task_id),
       -- Its condition ('' for none): the worker evaluates it before the handler (engine.conditions).
       s.condition,
       -- A cron run's instant and data interval (StartedAttempt.schedule; NULLs otherwise).
       r.scheduled_for, r.data_interval_start, r.data_interval_end
FROM started s JOIN core_workflowrun r ON r.id = s.workflow_run_id;


-- name: task_run_promote_dependents
-- The success path's promotion (the worker's batch): each pending all_success dependent of the generations in (ids, tokens) now succeeded whose dependencies have all succeeded goes pending -> ready (ready_at) with a 'promoted' event; returns how many of their tasks' dependents have another trigger rule (decide those next: task_run_settle_dependents); uniq_taskrun_per_run_task or idx_taskrun_task_run (each probe by run and task), core_taskrun_pkey.
-- The claim that follows in the same transaction (task_run_claim_fair) takes them within
-- their organization's room, permits and buckets. The default rule only, in main's form
-- (an anti-join that stops at the first upstream not succeeded): the rules' general
-- statement costs more to start on every hop, and a task with other rules below it pays
-- for it alone (task_runs._settle_after_successes).
WITH me AS (
    -- The (run, task) of each generation of this batch that is now succeeded.
    SELECT DISTINCT t.workflow_run_id AS run, t.task_id AS task
    FROM core_taskrun t JOIN unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS a(id, token)
         ON t.id = a.id AND t.fencing_token = a.token
    WHERE (t.state || '') = 'succeeded'   -- by primary key (file header)
), promoted AS (
    UPDATE core_taskrun d
    SET state = 'ready', ready_at = clock_timestamp(), skip_reason = ''
    -- Each dependent found by (run, task), one probe per edge (its LIMIT keeps the run and the
    -- task together in its index condition: joined, the generic plan could probe by the task
    -- alone, the run a join filter, reading an entry for every run of the task), not by
    -- scanning the run's pending rows; a dependent of two of these tasks is updated once.
    FROM me JOIN core_taskdependency dep ON dep.depends_on_id = me.task
         JOIN core_task k ON k.id = dep.task_id
         CROSS JOIN LATERAL (SELECT x.id FROM core_taskrun x
                             WHERE x.workflow_run_id = me.run AND x.task_id = dep.task_id LIMIT 1) c
    WHERE d.id = c.id AND (d.state || '') = 'pending'   -- by primary key
      AND k.trigger_rule = 'all_success'
      -- One probe by (run, task) per dependency edge (the LIMIT keeps the
      -- subquery from being flattened into a join): as a plain join, the generic plan read
      -- every task run of the run for each dependent, 5,000 x 5,000 rows for one success
      -- with 4,999 dependents (20 s, holding its worker process's batch and its
      -- organization's claim lock; another organization's completions waited behind it).
      AND NOT EXISTS (
          SELECT 1 FROM core_taskdependency e
          CROSS JOIN LATERAL (SELECT u.state FROM core_taskrun u
                              WHERE u.workflow_run_id = d.workflow_run_id AND u.task_id = e.depends_on_id
                              LIMIT 1) u
          WHERE e.task_id = d.task_id AND u.state <> 'succeeded')
    RETURNING d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token
), others AS (
    -- Dependents (of these tasks, in any state) whose rule is not all_success.
    SELECT count(*) AS n
    FROM me JOIN core_taskdependency dep ON dep.depends_on_id = me.task
         JOIN core_task k ON k.id = dep.task_id
    WHERE k.trigger_rule <> 'all_success'
), tr AS (
    SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token,
           'promoted'::text AS ev_kind, 'pending'::text AS ev_from, 'ready'::text AS ev_to,
           '{}'::jsonb AS ev_detail
    FROM promoted c
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
SELECT n FROM others;


-- name: task_run_settle_dependents
-- The trigger rules: each pending dependent of the finished task runs in ids goes pending -> ready (a 'promoted' event) or pending -> skipped (a 'skipped' event, skip_reason) once its trigger rule is decided by its upstream outcomes, else stays pending; returns (id, new state) of each it decided (settle the dependents of those it skipped next: task_runs.settle_dependents); uniq_taskrun_per_run_task or idx_taskrun_task_run (each probe by run and task), core_taskrun_pkey.
-- What follows a finish other than the worker's batch of successes (task_runs.settle_dependents,
-- after task_run_skip_descendants), and a success whose task has a dependent with a rule
-- other than all_success (task_run_promote_dependents counts those). Rules
-- (engine.states.TriggerRule, docs/api.md):
-- an upstream outcome is a success (succeeded), a failure (failed, or skipped with
-- skip_reason 'upstream_failed') or a skip (any other skip, cancelled); 'open' counts the
-- upstreams not finished. The verdict is 'ready', a skip_reason, or NULL (wait):
--   all_success  ready when all succeeded; 'upstream_failed' on a failure, 'trigger_rule' on a skip
--   all_failed   ready when all failed; 'trigger_rule' on a success or a skip
--   all_done     ready when none is open (always: the same)
--   one_failed   ready on a failure; 'trigger_rule' when none is open
--   one_success  ready on a success; when none is open 'upstream_failed' if one failed, else 'trigger_rule'
--   none_failed  'upstream_failed' on a failure; ready when none is open
-- The default rule after successes only needs no counts: ready when no upstream is
-- anything but succeeded, an anti-join that stops at the first such row (a failure or skip
-- among its upstreams would have skipped it when that happened).
WITH me AS (
    -- The (run, task) of each task run of ids that has finished, and whether it failed or was skipped.
    SELECT t.workflow_run_id AS run, t.task_id AS task, t.state <> 'succeeded' AS bad
    FROM core_taskrun t JOIN unnest(%(ids)s::uuid[]) AS a(id) ON t.id = a.id
    WHERE (t.state || '') IN ('succeeded', 'failed', 'skipped', 'cancelled')   -- by primary key (file header)
), cand AS (
    -- Each pending dependent once, found by (run, task), not by
    -- scanning the run's pending rows, with its rule.
    -- One probe per edge, as in task_run_promote_dependents.
    SELECT d.id, d.workflow_run_id, d.task_id, k.trigger_rule AS rule, bool_or(me.bad) AS after_bad
    FROM me
    JOIN core_taskdependency dep ON dep.depends_on_id = me.task
    JOIN core_task k ON k.id = dep.task_id
    CROSS JOIN LATERAL (SELECT x.id, x.workflow_run_id, x.task_id FROM core_taskrun x
                        WHERE x.workflow_run_id = me.run AND x.task_id = dep.task_id
                          AND (x.state || '') = 'pending'
                        LIMIT 1) d
    GROUP BY d.id, d.workflow_run_id, d.task_id, k.trigger_rule
), verdict AS MATERIALIZED (
    -- Materialized: each row's verdict is worked out once (inlined, the UPDATE below would
    -- evaluate the CASE, subqueries and all, once per column it sets).
    SELECT c.id, c.rule, CASE
        WHEN c.rule = 'all_success' AND NOT c.after_bad THEN
            -- One probe per dependency edge, as in task_run_promote_dependents.
            CASE WHEN NOT EXISTS (
                SELECT 1 FROM core_taskdependency e
                CROSS JOIN LATERAL (SELECT u.state FROM core_taskrun u
                                    WHERE u.workflow_run_id = c.workflow_run_id AND u.task_id = e.depends_on_id
                                    LIMIT 1) u
                WHERE e.task_id = c.task_id AND u.state <> 'succeeded') THEN 'ready' END
        ELSE (
            SELECT CASE c.rule
                WHEN 'all_success' THEN CASE WHEN n.failed > 0 THEN 'upstream_failed'
                                             WHEN n.skipped > 0 THEN 'trigger_rule'
                                             WHEN n.succeeded = n.total THEN 'ready' END
                WHEN 'all_failed' THEN CASE WHEN n.succeeded + n.skipped > 0 THEN 'trigger_rule'
                                            WHEN n.failed = n.total THEN 'ready' END
                WHEN 'all_done' THEN CASE WHEN n.open = 0 THEN 'ready' END
                WHEN 'always' THEN CASE WHEN n.open = 0 THEN 'ready' END
                WHEN 'one_failed' THEN CASE WHEN n.failed > 0 THEN 'ready'
                                            WHEN n.open = 0 THEN 'trigger_rule' END
                WHEN 'one_success' THEN CASE WHEN n.succeeded > 0 THEN 'ready'
                                             WHEN n.open = 0 AND n.failed > 0 THEN 'upstream_failed'
                                             WHEN n.open = 0 THEN 'trigger_rule' END
                WHEN 'none_failed' THEN CASE WHEN n.failed > 0 THEN 'upstream_failed'
                                             WHEN n.open = 0 THEN 'ready' END
            END
            FROM (
                SELECT x.*, x.total - x.succeeded - x.failed - x.skipped AS open
                FROM (SELECT count(*) AS total,
                             count(*) FILTER (WHERE u.state = 'succeeded') AS succeeded,
                             count(*) FILTER (WHERE u.state = 'failed'
                                              OR (u.state = 'skipped' AND u.skip_reason = 'upstream_failed')) AS failed,
                             count(*) FILTER (WHERE u.state = 'cancelled'
                                              OR (u.state = 'skipped' AND u.skip_reason <> 'upstream_failed')) AS skipped
                      FROM core_taskdependency e
                      -- One probe per dependency edge (task_run_promote_dependents).
                      CROSS JOIN LATERAL (SELECT u.state, u.skip_reason FROM core_taskrun u
                                          WHERE u.workflow_run_id = c.workflow_run_id
                                            AND u.task_id = e.depends_on_id
                                          LIMIT 1) u
                      WHERE e.task_id = c.task_id) x
            ) n)
    END AS verdict
    FROM cand c
), decided AS (
    UPDATE core_taskrun d
    SET state = CASE WHEN v.verdict = 'ready' THEN 'ready' ELSE 'skipped' END,
        ready_at = CASE WHEN v.verdict = 'ready' THEN clock_timestamp() ELSE d.ready_at END,
        finished_at = CASE WHEN v.verdict = 'ready' THEN NULL ELSE clock_timestamp() END,
        skip_reason = CASE WHEN v.verdict = 'ready' THEN '' ELSE v.verdict END
    FROM verdict v
    WHERE d.id = v.id AND v.verdict IS NOT NULL AND (d.state || '') = 'pending'   -- by primary key
    RETURNING d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token, d.state, d.skip_reason, v.rule
), tr AS (
    SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token,
           CASE WHEN c.state = 'ready' THEN 'promoted' ELSE 'skipped' END AS ev_kind,
           'pending'::text AS ev_from, c.state AS ev_to,
           -- The rule is named when it is not the default one.
           CASE WHEN c.state = 'skipped' THEN jsonb_build_object('reason', c.skip_reason)
                ELSE '{}'::jsonb END
           || CASE WHEN c.rule <> 'all_success' THEN jsonb_build_object('trigger_rule', c.rule)
                   ELSE '{}'::jsonb END AS ev_detail
    FROM decided c
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
SELECT id, state FROM decided;


-- name: task_run_heartbeat_many
-- Extend the worker leases of running generations (ids, tokens) by lease seconds, never past started_at + timeout_seconds; returns each extended id with the seconds its lease now runs; core_taskrun_pkey.
-- One instant (now_.at) for the extension and the answer: clock_timestamp() read again in
-- RETURNING had moved on, so a lease of 1 s answered 0.999 under load.
UPDATE core_taskrun t
SET lease_expires_at = LEAST(
    now_.at + make_interval(secs => %(lease)s),
    -- started_at + timeout_seconds, the timeout bounded first by what the LEAST can
    -- pick anyway (elapsed + lease), so no timestamp out of range is ever computed.
    CASE WHEN k.timeout_seconds IS NULL THEN 'infinity'::timestamptz
         ELSE t.started_at + make_interval(secs => LEAST(
             k.timeout_seconds, EXTRACT(EPOCH FROM now_.at - t.started_at)::float8 + %(lease)s))
    END)
FROM core_task k, unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS a(id, token),
     (SELECT clock_timestamp() AS at) now_
WHERE t.id = a.id AND t.fencing_token = a.token AND (t.state || '') = 'running' AND k.id = t.task_id
  AND t.lease_expires_at > now_.at   -- an expired lease belongs to the reaper now
RETURNING t.id, EXTRACT(EPOCH FROM t.lease_expires_at - now_.at)::float8;


-- name: task_run_fail_attempt
-- A started generation's handler failed: back to ready (attempt + 1, exponential backoff) while retryable and attempts remain, else failed; an event of kind with the error and, unless '', the traceback; core_taskrun_pkey.
-- SET expressions read the row's old values, so t.attempt - t.attempt_base < k.max_attempts is about this attempt.
-- 86400 is engine.definitions.MAX_RETRY_BACKOFF_SECONDS (tests/unit/test_sql_statements.py checks it).
WITH done AS (
    UPDATE core_taskrun t
    SET state = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN 'ready' ELSE 'failed' END,
        attempt = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN t.attempt + 1 ELSE t.attempt END,
        not_before = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts
            -- Doubling per attempt, up to MAX_RETRY_BACKOFF_SECONDS (engine.definitions).
            THEN clock_timestamp() + make_interval(
                secs => LEAST(k.retry_backoff_seconds * power(2, t.attempt - t.attempt_base - 1), 86400))
            ELSE NULL END,
        finished_at = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN NULL ELSE clock_timestamp() END,
        ready_at = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN clock_timestamp() ELSE t.ready_at END,
        error = %(error)s, lease_owner = NULL, lease_expires_at = NULL
    FROM core_task k
    WHERE t.id = %(id)s AND k.id = t.task_id AND t.state = 'running' AND t.fencing_token = %(token)s
      AND t.started_fencing_token = %(token)s
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id, t.state,
              t.not_before
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id,
           CASE WHEN d.state = 'ready' THEN d.attempt - 1 ELSE d.attempt END AS attempt, d.fencing_token,
           %(kind)s::text AS ev_kind, 'running'::text AS ev_from, d.state AS ev_to,
           jsonb_build_object('error', %(error)s::text, 'retry_at', d.not_before)
               -- The handler's traceback beside its error (issue 19), when it sent one.
               || CASE WHEN %(traceback)s::text = '' THEN '{}'::jsonb
                       ELSE jsonb_build_object('traceback', %(traceback)s::text) END AS ev_detail
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
SELECT id, workflow_run_id, task_id, state, attempt, not_before FROM done;


-- name: task_run_fail_undelivered
-- A claimed, never-started generation whose outbox row was dead-lettered fails (retryable false: failed at once); an event of kind; core_taskrun_pkey.
-- The same SET as task_run_fail_attempt; 86400 is engine.definitions.MAX_RETRY_BACKOFF_SECONDS.
WITH done AS (
    UPDATE core_taskrun t
    SET state = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN 'ready' ELSE 'failed' END,
        attempt = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN t.attempt + 1 ELSE t.attempt END,
        not_before = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts
            -- Doubling per attempt, up to MAX_RETRY_BACKOFF_SECONDS (engine.definitions).
            THEN clock_timestamp() + make_interval(
                secs => LEAST(k.retry_backoff_seconds * power(2, t.attempt - t.attempt_base - 1), 86400))
            ELSE NULL END,
        finished_at = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN NULL ELSE clock_timestamp() END,
        ready_at = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN clock_timestamp() ELSE t.ready_at END,
        error = %(error)s, lease_owner = NULL, lease_expires_at = NULL
    FROM core_task k
    WHERE t.id = %(id)s AND k.id = t.task_id AND t.state = 'running' AND t.fencing_token = %(token)s
      AND t.started_fencing_token IS DISTINCT FROM %(token)s
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id, t.state,
              t.not_before
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id,
           CASE WHEN d.state = 'ready' THEN d.attempt - 1 ELSE d.attempt END AS attempt, d.fencing_token,
           %(kind)s::text AS ev_kind, 'running'::text AS ev_from, d.state AS ev_to,
           jsonb_build_object('error', %(error)s::text, 'retry_at', d.not_before)
               -- The handler's traceback beside its error (issue 19), when it sent one.
               || CASE WHEN %(traceback)s::text = '' THEN '{}'::jsonb
                       ELSE jsonb_build_object('traceback', %(traceback)s::text) END AS ev_detail
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
SELECT id, workflow_run_id, task_id, state, attempt, not_before FROM done;


-- name: task_run_fail_expired_lease
-- A started generation whose lease expired fails this attempt (retried with backoff while attempts remain) and its token is bumped so its completion can never match; an event of kind; core_taskrun_pkey.
-- The same SET as task_run_fail_attempt plus the token bump; 86400 is engine.definitions.MAX_RETRY_BACKOFF_SECONDS.
WITH done AS (
    UPDATE core_taskrun t
    SET state = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN 'ready' ELSE 'failed' END,
        attempt = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN t.attempt + 1 ELSE t.attempt END,
        not_before = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts
            -- Doubling per attempt, up to MAX_RETRY_BACKOFF_SECONDS (engine.definitions).
            THEN clock_timestamp() + make_interval(
                secs => LEAST(k.retry_backoff_seconds * power(2, t.attempt - t.attempt_base - 1), 86400))
            ELSE NULL END,
        finished_at = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN NULL ELSE clock_timestamp() END,
        ready_at = CASE WHEN %(retryable)s AND t.attempt - t.attempt_base < k.max_attempts THEN clock_timestamp() ELSE t.ready_at END,
        fencing_token = t.fencing_token + 1, error = %(error)s, lease_owner = NULL, lease_expires_at = NULL
    FROM core_task k
    WHERE t.id = %(id)s AND k.id = t.task_id AND t.state = 'running' AND t.fencing_token = %(token)s
      AND t.lease_expires_at < clock_timestamp()
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id, t.state,
              t.not_before
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id,
           CASE WHEN d.state = 'ready' THEN d.attempt - 1 ELSE d.attempt END AS attempt, d.fencing_token,
           %(kind)s::text AS ev_kind, 'running'::text AS ev_from, d.state AS ev_to,
           jsonb_build_object('error', %(error)s::text, 'retry_at', d.not_before)
               -- The handler's traceback beside its error (issue 19), when it sent one.
               || CASE WHEN %(traceback)s::text = '' THEN '{}'::jsonb
                       ELSE jsonb_build_object('traceback', %(traceback)s::text) END AS ev_detail
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
SELECT id, workflow_run_id, task_id, state, attempt, not_before FROM done;


-- name: task_run_requeue_never_started
-- A claimed generation that never started and whose dispatch lease expired goes back to ready (token + 1, no attempt used) with a 'dispatch_expired' event; core_taskrun_pkey.
WITH back AS (
    UPDATE core_taskrun t
    SET state = 'ready', fencing_token = t.fencing_token + 1, lease_owner = NULL, lease_expires_at = NULL,
        ready_at = clock_timestamp()
    WHERE t.id = %(id)s AND t.state = 'running' AND t.fencing_token = %(token)s
      AND t.lease_expires_at < clock_timestamp()
      AND t.started_fencing_token IS DISTINCT FROM t.fencing_token
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token
), tr AS (
    SELECT b.*, 'dispatch_expired'::text AS ev_kind, 'running'::text AS ev_from, 'ready'::text AS ev_to,
           jsonb_build_object('reason', 'not started before its lease expired') AS ev_detail
    FROM back b
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
SELECT id FROM back;


-- name: task_run_lease_reached_timeout
-- Whether a task run's lease ended at its task's timeout_seconds (a timed-out attempt, not a lost worker); core_taskrun_pkey.
SELECT k.timeout_seconds IS NOT NULL
       -- Less a microsecond: an interval holds whole microseconds, a timeout may not.
       AND EXTRACT(EPOCH FROM t.lease_expires_at - t.started_at) >= k.timeout_seconds - 0.000001
FROM core_taskrun t JOIN core_task k ON k.id = t.task_id WHERE t.id = %(id)s;


-- name: task_run_get_expired_leases
-- Up to limit (id, fencing_token) of running task runs whose lease expired, oldest expiry first; idx_taskrun_lease_expiry (partial: state = 'running').
-- statement_timestamp(), not clock_timestamp(): a volatile function cannot bound an index
-- scan, and the planner would then rather filter idx_taskrun_state_age's running rows.
-- With a stable bound the partial idx_taskrun_lease_expiry serves the range and the order.
SELECT id, fencing_token FROM core_taskrun
WHERE state = 'running' AND lease_expires_at < statement_timestamp()   -- idx_taskrun_lease_expiry (partial)
ORDER BY lease_expires_at LIMIT %(limit)s;


-- name: task_run_skip_descendants
-- The pending descendants of the failed or skipped task runs in ids that their trigger rules skip whatever else happens, each skipped with a 'skipped' event (skip_reason upstream_failed below a failure, else trigger_rule); uniq_taskrun_per_run_task or idx_taskrun_task_run (each probe by run and task), core_taskrun_pkey.
-- The closure, in one statement rather than a level at a time: below a failure or a skip,
-- an all_success task is skipped, and below a failure a none_failed one, and so on down
-- through what these skip. Dependents with the other rules (all_done, always, one_failed,
-- one_success, all_failed) stop it: task_run_settle_dependents decides them next, on the
-- task runs of ids and those skipped here (task_runs.settle_dependents).
WITH RECURSIVE src AS (
    SELECT t.workflow_run_id AS run, t.task_id AS task,
           (t.state = 'failed' OR (t.state = 'skipped' AND t.skip_reason = 'upstream_failed')) AS failure
    FROM core_taskrun t
    WHERE t.id = ANY(%(ids)s::uuid[])
      AND (t.state || '') IN ('failed', 'skipped', 'cancelled')   -- by primary key (file header)
), below(run, task, failure) AS (
    SELECT run, task, failure FROM src
    UNION
    SELECT b.run, e.task_id, b.failure
    FROM below b
    JOIN core_taskdependency e ON e.depends_on_id = b.task
    JOIN core_task k ON k.id = e.task_id
    -- One probe by (run, task) per edge (the LIMIT keeps it from being
    -- flattened into a join): as a join, the generic plan read the run's pending task runs
    -- for each row of the level (a failed root with 4,999 dependents: 16.7 s).
    CROSS JOIN LATERAL (SELECT d.state FROM core_taskrun d
                        WHERE d.workflow_run_id = b.run AND d.task_id = e.task_id LIMIT 1) d
    WHERE (d.state || '') = 'pending'   -- by (run, task): no scan of every pending row by state
      AND (k.trigger_rule = 'all_success' OR (k.trigger_rule = 'none_failed' AND b.failure))
), doomed AS (
    -- A task reached by a failure's path and a skip's is skipped for the failure.
    SELECT b.run, b.task, bool_or(b.failure) AS failure
    FROM below b
    WHERE NOT EXISTS (SELECT 1 FROM src s WHERE s.run = b.run AND s.task = b.task)
    GROUP BY b.run, b.task
), open AS (
    -- Lock them in id order first (fewer deadlocks with completions); each found by one
    -- probe by (run, task). Joined, under the statistics of small runs, the plan probed by
    -- the run alone and filtered by task (half the run per skipped task), or read the whole
    -- table (a review: 44,850 rows filtered out for 300 skipped, 60 ms).
    SELECT d.id, x.failure FROM doomed x
    CROSS JOIN LATERAL (SELECT p.id FROM core_taskrun p
                        WHERE p.workflow_run_id = x.run AND p.task_id = x.task LIMIT 1) p
    JOIN core_taskrun d ON d.id = p.id
    WHERE (d.state || '') = 'pending'   -- by primary key
    ORDER BY d.id
    FOR UPDATE OF d
), skipped AS (
    UPDATE core_taskrun d
    SET state = 'skipped', finished_at = clock_timestamp(), not_before = NULL,
        skip_reason = CASE WHEN o.failure THEN 'upstream_failed' ELSE 'trigger_rule' END
    FROM open o
    WHERE d.id = o.id AND (d.state || '') = 'pending'   -- by primary key
    RETURNING d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token, d.skip_reason, d.task_id
), tr AS (
    SELECT s.id, s.workflow_run_id, s.organization_id, s.attempt, s.fencing_token,
           'skipped'::text AS ev_kind, 'pending'::text AS ev_from, 'skipped'::text AS ev_to,
           jsonb_build_object('reason', s.skip_reason)
           || CASE WHEN k.trigger_rule <> 'all_success' THEN jsonb_build_object('trigger_rule', k.trigger_rule)
                   ELSE '{}'::jsonb END AS ev_detail
    FROM skipped s JOIN core_task k ON k.id = s.task_id
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
SELECT id FROM skipped;


-- name: task_run_finished_of_run
-- The ids of run's finished task runs (succeeded, failed, skipped, cancelled): what a repair settles the dependents of (task_runs.settle_run); idx_taskrun_run_state.
SELECT id FROM core_taskrun
WHERE workflow_run_id = %(run)s AND state IN ('succeeded', 'failed', 'skipped', 'cancelled');


-- name: task_run_skip_condition_false
-- A started generation whose condition was false (evaluated by its worker before the handler) becomes skipped (skip_reason condition_false, its lease released) with a 'skipped' event naming the condition; core_taskrun_pkey.
WITH done AS (
    UPDATE core_taskrun t
    SET state = 'skipped', skip_reason = 'condition_false', finished_at = clock_timestamp(),
        lease_owner = NULL, lease_expires_at = NULL, not_before = NULL
    FROM core_task k
    WHERE t.id = %(id)s AND k.id = t.task_id AND t.state = 'running' AND t.fencing_token = %(token)s
      AND t.started_fencing_token = %(token)s
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, t.task_id, t.state,
              k.condition
), tr AS (
    SELECT d.id, d.workflow_run_id, d.organization_id, d.attempt, d.fencing_token,
           'skipped'::text AS ev_kind, 'running'::text AS ev_from, 'skipped'::text AS ev_to,
           jsonb_build_object('reason', 'condition_false', 'condition', d.condition) AS ev_detail
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
SELECT id, workflow_run_id, task_id, state FROM done;


-- name: task_run_cancel_open
-- Every open (pending, ready, running) task run of a run still pending or running becomes cancelled, a running one's token bumped, with a 'cancelled' event (reason); idx_taskrun_run_state.
WITH open AS (
    -- Lock the open rows in id order first (fewer deadlocks with completions) and
    -- remember their state for the events.
    SELECT t.id, t.state FROM core_taskrun t
    WHERE t.workflow_run_id = %(run)s AND t.state IN ('pending', 'ready', 'running')
      AND EXISTS (SELECT 1 FROM core_workflowrun r WHERE r.id = t.workflow_run_id
                  AND r.state IN ('pending', 'running'))
    ORDER BY t.id
    FOR UPDATE
), c AS (
    UPDATE core_taskrun t
    SET state = 'cancelled', finished_at = clock_timestamp(), lease_owner = NULL,
        lease_expires_at = NULL, not_before = NULL,
        fencing_token = t.fencing_token + CASE WHEN t.state = 'running' THEN 1 ELSE 0 END
    FROM open o
    WHERE t.id = o.id AND t.state IN ('pending', 'ready', 'running')
    RETURNING t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token, o.state AS old_state
), tr AS (
    SELECT c.id, c.workflow_run_id, c.organization_id, c.attempt, c.fencing_token,
           'cancelled'::text AS ev_kind, c.old_state AS ev_from, 'cancelled'::text AS ev_to,
           jsonb_build_object('reason', %(reason)s::text) AS ev_detail
    FROM c
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
SELECT count(*) FROM c;


-- name: task_run_get_generation
-- A task run's run, state, fencing token and started token (to record why a start or completion was refused); core_taskrun_pkey.
SELECT workflow_run_id, state, fencing_token, started_fencing_token FROM core_taskrun WHERE id = %(id)s;
