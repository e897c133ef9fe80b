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
-- Append log lines (levels, messages) to the started generation token of a worker task run of the organization, only while that generation holds an unexpired lease; returns how many were kept; core_taskrun_pkey, idx_tasklog_taskrun.
INSERT INTO core_tasklog (organization_id, workflow_run_id, task_run_id, attempt, fencing_token, level, message,
                          created_at)
SELECT t.organization_id, t.workflow_run_id, t.id, t.attempt, t.fencing_token, l.level, l.message, clock_timestamp()
FROM core_taskrun t, unnest(%(levels)s::text[], %(messages)s::text[]) WITH ORDINALITY AS l(level, message, n)
WHERE t.id = %(id)s AND t.organization_id = %(org)s AND t.queue <> ''
  AND (t.state || '') = 'running' AND t.fencing_token = %(token)s AND t.started_fencing_token = %(token)s
  AND t.lease_expires_at > clock_timestamp()
ORDER BY l.n
RETURNING 1;


-- name: worker_queue_summary
-- Per queue of the organization: ready task runs, the oldest one's ready_at, running ones, and the workers seen polling it since the cutoff (seconds ago); idx_taskrun_ready_claim, idx_taskrun_running_org, uniq_worker_org_queue_id.
WITH q AS (
    SELECT DISTINCT k.queue FROM core_task k
    WHERE k.organization_id = %(org)s AND k.queue <> ''
    UNION
    SELECT w.queue FROM core_workerconnection w WHERE w.organization_id = %(org)s
)
SELECT q.queue,
       (SELECT count(*) FROM core_taskrun t
        WHERE t.queue = q.queue AND t.organization_id = %(org)s AND t.state = 'ready'),
       (SELECT min(COALESCE(t.ready_at, t.created_at)) FROM core_taskrun t
        WHERE t.queue = q.queue AND t.organization_id = %(org)s AND t.state = 'ready'),
       (SELECT count(*) FROM core_taskrun t
        WHERE t.organization_id = %(org)s AND t.state = 'running' AND t.queue = q.queue),
       (SELECT count(*) FROM core_workerconnection w
        WHERE w.organization_id = %(org)s AND w.queue = q.queue
          AND w.last_seen_at > clock_timestamp() - make_interval(secs => %(cutoff)s))
FROM q ORDER BY q.queue;
