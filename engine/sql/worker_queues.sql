-- Statements of the organizations' own workers' queues (issue 18, docs/workers.md) that
-- do not change a task run's state: the poll's bookkeeping (the workers seen, when the
-- queue's next task is due), the lookup that scopes a worker's call to its organization's
-- worker task runs, and the log lines a worker sends. The claim and the transitions are
-- task_runs.sql's (task_run_claim_fair with claim_queue, task_run_start_many, ...).
--
-- Parameters are psycopg's: %(name)s.


-- name: worker_seen
-- Upsert the worker (organization, queue, worker_id) as seen now, with what it says of itself; written only when something changed or last_seen_at is older than resolution seconds, so an idle worker's polls do not write each time; a new row only while the organization has fewer than cap rows; uniq_worker_org_queue_id.
INSERT INTO core_workerconnection AS w
    (id, organization_id, worker_id, queue, name, host, sdk, concurrency, api_key_id, first_seen_at, last_seen_at)
SELECT gen_random_uuid(), %(org)s, %(worker_id)s, %(queue)s, %(name)s, %(host)s, %(sdk)s, %(concurrency)s,
       %(api_key)s, clock_timestamp(), clock_timestamp()
-- The cap: a hostile member polling with made-up worker ids and queue names cannot grow the
-- table without bound (a known worker's row is still refreshed).
WHERE (SELECT count(*) FROM core_workerconnection c WHERE c.organization_id = %(org)s) < %(cap)s
   OR EXISTS (SELECT 1 FROM core_workerconnection c
              WHERE c.organization_id = %(org)s AND c.queue = %(queue)s AND c.worker_id = %(worker_id)s)
ON CONFLICT ON CONSTRAINT uniq_worker_org_queue_id DO UPDATE SET
    name = EXCLUDED.name, host = EXCLUDED.host, sdk = EXCLUDED.sdk, concurrency = EXCLUDED.concurrency,
    api_key_id = EXCLUDED.api_key_id, last_seen_at = EXCLUDED.last_seen_at
WHERE w.last_seen_at < clock_timestamp() - make_interval(secs => %(resolution)s)
   OR (w.name, w.host, w.sdk, w.concurrency, w.api_key_id)
      IS DISTINCT FROM (EXCLUDED.name, EXCLUDED.host, EXCLUDED.sdk, EXCLUDED.concurrency, EXCLUDED.api_key_id);


-- name: worker_connection_purge_batch
-- Delete up to limit workers not seen polling for seven days (the workers page forgets them); idx_workerconn_last_seen.
DELETE FROM core_workerconnection WHERE id IN (
    SELECT id FROM core_workerconnection
    WHERE last_seen_at < clock_timestamp() - interval '7 days'   -- idx_workerconn_last_seen
    ORDER BY last_seen_at
    LIMIT %(limit)s
);


-- name: worker_run_workflow_names
-- The workflow name of each run in runs (what a poll's answer names the task's workflow by); core_workflowrun_pkey.
SELECT r.id, w.name FROM core_workflowrun r JOIN core_workflow w ON w.id = r.workflow_id
WHERE r.id = ANY(%(runs)s::uuid[]);


-- name: worker_queue_known
-- Whether some task of the organization (of any workflow version, archived ones included) waits on queue; idx_task_org_queue.
SELECT EXISTS (SELECT 1 FROM core_task k WHERE k.organization_id = %(org)s AND k.queue = %(queue)s AND k.queue <> '');


-- name: worker_queue_next_due
-- Seconds until the first ready task run of the organization's queue may be claimed (0 or less: now, yet the claim left it, e.g. for a concurrency limit; NULL: nothing ready), looking at most 1,000 of them; idx_taskrun_ready_claim.
SELECT EXTRACT(EPOCH FROM min(COALESCE(x.not_before, clock_timestamp())) - clock_timestamp())::float8
FROM (SELECT t.not_before FROM core_taskrun t
      WHERE t.queue = %(queue)s AND t.organization_id = %(org)s AND t.state = 'ready'   -- idx_taskrun_ready_claim
      LIMIT 1000) x;


-- name: worker_task_run_generation
-- A worker task run of the organization (NULL row when it is not one: another organization's, a shared workers' task, or none): its run, state, tokens, whether its lease is still current, whether any task depends on it, its task's config and its queue; core_taskrun_pkey.
SELECT t.workflow_run_id, t.state, t.fencing_token, t.started_fencing_token,
       t.lease_expires_at > clock_timestamp(), t.attempt,
       EXISTS (SELECT 1 FROM core_taskdependency d WHERE d.depends_on_id = t.task_id), k.config, t.queue
FROM core_taskrun t JOIN core_task k ON k.id = t.task_id
WHERE t.id = %(id)s AND t.organization_id = %(org)s AND t.queue <> '';


-- name: task_log_append
-- Append log lines (levels, messages) to the started generation token of a worker task run of the organization, only while that generation holds an unexpired lease and its lines stay within max_lines and max_bytes (of messages, UTF-8): the first line past either is replaced by one 'system' line (marker) and the rest are dropped, as is every later line; returns the stream of each row written; core_taskrun_pkey, idx_tasklog_taskrun.
WITH gen AS (
    SELECT t.organization_id, t.workflow_run_id, t.id, t.attempt, t.fencing_token, r.created_at AS run_created_at
    FROM core_taskrun t JOIN core_workflowrun r ON r.id = t.workflow_run_id  -- core_workflowrun_pkey
    WHERE t.id = %(id)s AND t.organization_id = %(org)s AND t.queue <> ''
      AND (t.state || '') = 'running' AND t.fencing_token = %(token)s AND t.started_fencing_token = %(token)s
      AND t.lease_expires_at > clock_timestamp()
), used AS (
    -- What the generation holds already: at most the caps, then the marker (its only
    -- 'system' line), after which nothing more is kept. One row, also without gen.
    SELECT count(*) AS lines, COALESCE(sum(octet_length(x.message)), 0) AS bytes,
           COALESCE(bool_or(x.stream = 'system'), false) AS full
    FROM gen JOIN core_tasklog x ON x.task_run_id = gen.id AND x.fencing_token = gen.fencing_token  -- idx_tasklog_taskrun
                                AND x.run_created_at = gen.run_created_at  -- the run's partition only
), sent AS (
    SELECT l.level, l.message, l.n, sum(octet_length(l.message)) OVER (ORDER BY l.n) AS upto
    FROM unnest(%(levels)s::text[], %(messages)s::text[]) WITH ORDINALITY AS l(level, message, n)
), kept AS (
    -- A prefix of the lines sent: both running totals only grow.
    SELECT s.level, s.message, s.n FROM sent s, used u
    WHERE NOT u.full AND u.lines + s.n <= %(max_lines)s AND u.bytes + s.upto <= %(max_bytes)s
), lines AS (
    SELECT 'worker' AS stream, k.level, k.message, k.n FROM kept k
    UNION ALL
    SELECT 'system', 'warning', %(marker)s::text, (SELECT count(*) FROM kept) + 1
    FROM used u WHERE NOT u.full AND (SELECT count(*) FROM kept) < cardinality(%(messages)s::text[])
)
INSERT INTO core_tasklog (organization_id, workflow_run_id, task_run_id, attempt, fencing_token, stream, level, message,
                          created_at, run_created_at)
SELECT g.organization_id, g.workflow_run_id, g.id, g.attempt, g.fencing_token, l.stream, l.level, l.message,
       clock_timestamp(), g.run_created_at
FROM gen g, lines l
ORDER BY l.n
RETURNING stream;


-- name: attempt_secrets_put
-- Keep the encrypted secret values handed to generation token of the organization's task run id, replacing an earlier generation's; core_attemptsecrets_pkey.
INSERT INTO core_attemptsecrets (task_run_id, organization_id, fencing_token, values_encrypted, created_at)
VALUES (%(id)s, %(org)s, %(token)s, %(values)s, clock_timestamp())
ON CONFLICT (task_run_id) DO UPDATE
SET fencing_token = EXCLUDED.fencing_token, values_encrypted = EXCLUDED.values_encrypted,
    created_at = EXCLUDED.created_at;


-- name: attempt_secrets_get
-- The encrypted secret values handed to generation token of the organization's task run id (no row: none were); core_attemptsecrets_pkey.
SELECT s.values_encrypted FROM core_attemptsecrets s
WHERE s.task_run_id = %(id)s AND s.organization_id = %(org)s AND s.fencing_token = %(token)s;


-- name: attempt_secrets_purge_batch
-- Delete up to limit rows of generations that are no longer running (finished, retried, cancelled, or their lease ran out and another took over); core_attemptsecrets_pkey, core_taskrun_pkey.
DELETE FROM core_attemptsecrets WHERE task_run_id IN (
    SELECT s.task_run_id FROM core_attemptsecrets s
    WHERE NOT EXISTS (SELECT 1 FROM core_taskrun t
                      WHERE t.id = s.task_run_id AND t.state = 'running' AND t.started_fencing_token = s.fencing_token)
    LIMIT %(limit)s
);


-- name: worker_queue_summary
-- A page of the organization's queues (named by a task or polled by a worker) after the name after ('' for the first), by name, at most limit: ready task runs, the oldest one's ready_at and its age in seconds, running ones, and the live workers (seen polling since cutoff seconds ago, or holding a running task run of the queue whose lease is current: the held part, as in worker_list and worker_queue_live); idx_taskrun_ready_claim, idx_taskrun_running_org, uniq_worker_org_queue_id.
WITH held AS (
    -- Per queue and worker (lease_owner 'worker:<worker id>'): its running task runs, and
    -- those whose lease is current. A worker whose slots are all busy does not poll: it is
    -- live while its heartbeats keep a lease current.
    SELECT t.queue, t.lease_owner, count(*) AS tasks,
           count(*) FILTER (WHERE t.lease_expires_at > clock_timestamp()) AS leased
    FROM core_taskrun t
    WHERE t.organization_id = %(org)s AND t.state = 'running' AND t.queue <> ''    -- idx_taskrun_running_org
    GROUP BY t.queue, t.lease_owner
), q AS (
    SELECT DISTINCT k.queue FROM core_task k
    WHERE k.organization_id = %(org)s AND k.queue <> '' AND k.queue > %(after)s
    UNION
    SELECT w.queue FROM core_workerconnection w WHERE w.organization_id = %(org)s AND w.queue > %(after)s
), page AS (
    SELECT q.queue FROM q ORDER BY q.queue LIMIT %(limit)s
), ready AS (
    SELECT p.queue,
           (SELECT count(*) FROM core_taskrun t
            WHERE t.queue = p.queue AND t.organization_id = %(org)s AND t.state = 'ready') AS ready,
           (SELECT min(COALESCE(t.ready_at, t.created_at)) FROM core_taskrun t
            WHERE t.queue = p.queue AND t.organization_id = %(org)s AND t.state = 'ready') AS oldest
    FROM page p
)
SELECT r.queue, r.ready, r.oldest,
       CASE WHEN r.oldest IS NOT NULL THEN greatest(0, EXTRACT(EPOCH FROM clock_timestamp() - r.oldest))::float8 END,
       (SELECT count(*) FROM core_taskrun t
        WHERE t.organization_id = %(org)s AND t.state = 'running' AND t.queue = r.queue),
       (SELECT count(*) FROM core_workerconnection w
        LEFT JOIN held h ON h.queue = w.queue AND h.lease_owner = 'worker:' || w.worker_id
        WHERE w.organization_id = %(org)s AND w.queue = r.queue
          AND (w.last_seen_at > clock_timestamp() - make_interval(secs => %(cutoff)s) OR COALESCE(h.leased, 0) > 0))
FROM ready r ORDER BY r.queue;


-- name: worker_list
-- The organization's workers (of queue only, unless NULL) by (queue, worker_id) after (after_queue, after_id) (NULL for the first), at most limit, only live ones (live true), only the others (false) or all (NULL), and among those not live only the ones seen since seen_within seconds ago (NULL: all): what each says of itself, when first and last seen, the running task runs it holds, whether it is live (the held part, as in worker_queue_summary); uniq_worker_org_queue_id, idx_taskrun_running_org.
WITH held AS (
    -- Per queue and worker (lease_owner 'worker:<worker id>'): its running task runs, and
    -- those whose lease is current. A worker whose slots are all busy does not poll: it is
    -- live while its heartbeats keep a lease current.
    SELECT t.queue, t.lease_owner, count(*) AS tasks,
           count(*) FILTER (WHERE t.lease_expires_at > clock_timestamp()) AS leased
    FROM core_taskrun t
    WHERE t.organization_id = %(org)s AND t.state = 'running' AND t.queue <> ''    -- idx_taskrun_running_org
    GROUP BY t.queue, t.lease_owner
), w AS (
    SELECT w.queue, w.worker_id, w.name, w.host, w.sdk, w.concurrency, w.first_seen_at, w.last_seen_at,
           COALESCE(h.tasks, 0) AS tasks_held,
           (w.last_seen_at > clock_timestamp() - make_interval(secs => %(cutoff)s) OR COALESCE(h.leased, 0) > 0)
               AS live
    FROM core_workerconnection w
    LEFT JOIN held h ON h.queue = w.queue AND h.lease_owner = 'worker:' || w.worker_id
    WHERE w.organization_id = %(org)s                                               -- uniq_worker_org_queue_id
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s::text)
      AND (%(after_queue)s::text IS NULL OR (w.queue, w.worker_id) > (%(after_queue)s::text, %(after_id)s::text))
)
SELECT w.queue, w.worker_id, w.name, w.host, w.sdk, w.concurrency, w.first_seen_at, w.last_seen_at,
       w.tasks_held, w.live
FROM w
WHERE (%(live)s::boolean IS NULL OR w.live = %(live)s::boolean)
  AND (%(seen_within)s::float8 IS NULL OR w.live
       OR w.last_seen_at > clock_timestamp() - make_interval(secs => %(seen_within)s::float8))
ORDER BY w.queue, w.worker_id
LIMIT %(limit)s;


-- name: worker_queue_live
-- For each queue named in queues: the organization's live workers on it (seen polling since cutoff seconds ago, or holding a running task run of the queue whose lease is current: the held part, as in worker_queue_summary); uniq_worker_org_queue_id, idx_taskrun_running_org.
WITH held AS (
    -- Per queue and worker (lease_owner 'worker:<worker id>'): its running task runs, and
    -- those whose lease is current. A worker whose slots are all busy does not poll: it is
    -- live while its heartbeats keep a lease current.
    SELECT t.queue, t.lease_owner, count(*) AS tasks,
           count(*) FILTER (WHERE t.lease_expires_at > clock_timestamp()) AS leased
    FROM core_taskrun t
    WHERE t.organization_id = %(org)s AND t.state = 'running' AND t.queue <> ''    -- idx_taskrun_running_org
    GROUP BY t.queue, t.lease_owner
)
SELECT q.queue,
       (SELECT count(*) FROM core_workerconnection w
        LEFT JOIN held h ON h.queue = w.queue AND h.lease_owner = 'worker:' || w.worker_id
        WHERE w.organization_id = %(org)s AND w.queue = q.queue
          AND (w.last_seen_at > clock_timestamp() - make_interval(secs => %(cutoff)s) OR COALESCE(h.leased, 0) > 0))
FROM unnest(%(queues)s::text[]) AS q(queue);


-- name: task_log_run_tail
-- The log lines the run page shows: for at most tasks worker task runs of the organization's run (those with the newest lines), the last lines (at most limit) of the generation that wrote its newest line: (task_run_id, id, attempt, fencing_token, level, message, created_at), task runs by newest line first, then lines oldest first; idx_taskrun_run_state or uniq_taskrun_per_run_task (both lead with the run), idx_tasklog_taskrun (read backwards).
SELECT t.id, l.id, l.attempt, l.fencing_token, l.level, l.message, l.created_at
FROM (
    SELECT t.id, last.id AS last_id, last.fencing_token, t.run_created_at
    FROM (SELECT t.*, r.created_at AS run_created_at FROM core_taskrun t
          JOIN core_workflowrun r ON r.id = t.workflow_run_id) t                     -- core_workflowrun_pkey
    CROSS JOIN LATERAL (
        SELECT x.id, x.fencing_token FROM core_tasklog x
        WHERE x.task_run_id = t.id AND x.run_created_at = t.run_created_at         -- the run's partition only
        ORDER BY x.id DESC LIMIT 1                                                 -- idx_tasklog_taskrun
    ) last
    WHERE t.workflow_run_id = %(run)s AND t.organization_id = %(org)s AND t.queue <> ''   -- the run's task runs
    ORDER BY last.id DESC
    LIMIT %(tasks)s
) t
CROSS JOIN LATERAL (
    -- Only the generation holding the lease may append (task_log_append), so its lines are
    -- the task run's last ones: the backward scan reads them first.
    SELECT y.id, y.attempt, y.fencing_token, y.level, y.message, y.created_at FROM core_tasklog y
    WHERE y.task_run_id = t.id AND y.fencing_token = t.fencing_token AND y.run_created_at = t.run_created_at
    ORDER BY y.id DESC LIMIT %(limit)s                                             -- idx_tasklog_taskrun
) l
ORDER BY t.last_id DESC, l.id;
