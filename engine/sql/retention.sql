-- Run retention (issue 21; engine.retention, docs/retention.md): finished runs past their
-- organization's retention are removed with everything they own, a bounded batch per
-- transaction; published outbox rows go soon after publishing.
--
-- Parameters are psycopg's: %(name)s.


-- name: run_retention_candidates
-- Up to per_org finished runs of each organization past its retention (run_retention_days, else default_seconds, the deployment's in seconds; 0 keeps forever), oldest first, at most limit in all; idx_wfrun_org_recent (a range of created_at per organization: a run finished before the cutoff was created before it).
SELECT c.id, c.organization_id
FROM core_organization o
CROSS JOIN LATERAL (
    SELECT r.id, r.organization_id, r.created_at
    FROM core_workflowrun r
    WHERE r.organization_id = o.id
      AND r.created_at < clock_timestamp() - make_interval(secs => COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s))
      AND r.finished_at < clock_timestamp() - make_interval(secs => COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s))
      AND r.state IN ('succeeded', 'failed', 'cancelled')
    ORDER BY r.created_at DESC  -- the index's order; any old run will do
    LIMIT %(per_org)s
) c
WHERE COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s) > 0
LIMIT %(limit)s;


-- name: run_retention_counts
-- Per organization with runs past its retention: how many, and the oldest run's created_at (the purge preview and the admin's purge lag); idx_wfrun_org_recent.
SELECT o.id, o.slug, COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s) AS seconds, c.n, c.oldest
FROM core_organization o
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(r.created_at) AS oldest
    FROM core_workflowrun r
    WHERE r.organization_id = o.id
      AND r.created_at < clock_timestamp() - make_interval(secs => COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s))
      AND r.finished_at < clock_timestamp() - make_interval(secs => COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s))
      AND r.state IN ('succeeded', 'failed', 'cancelled')
) c
WHERE COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s) > 0 AND c.n > 0
ORDER BY o.slug;


-- name: run_lock_finished
-- Lock the runs of run_ids that are still finished, skipping any another transaction holds (a resume); core_workflowrun_pkey.
SELECT r.id
FROM core_workflowrun r
WHERE r.id = ANY(%(run_ids)s::uuid[]) AND r.state IN ('succeeded', 'failed', 'cancelled')
FOR UPDATE SKIP LOCKED;


-- name: run_payload_keys
-- The offloaded payloads (id, storage_key) of the runs in run_ids: their files go before the rows; idx_offloadedpayload_run.
SELECT p.id, p.storage_key
FROM core_offloadedpayload p
WHERE p.workflow_run_id = ANY(%(run_ids)s::uuid[]);


-- name: run_purge_many
-- Remove the runs of run_ids that are still finished (locked; SKIP LOCKED leaves a run being resumed to a later pass) with everything they own: events and logs (but not those of a run created before horizon, when given: their partition is dropped whole, engine.partitions), outbox rows, attempt secrets, offloaded payload rows, idempotency keys, trigger firings, live subscriptions, notification events with their deliveries and attempts, task runs; a later run that retried one forgets it. One statement: the foreign keys are checked at its end. Returns the removed runs' ids; each child by its run's index (uniq_event_run_seq, idx_tasklog_run, uniq_taskrun_per_run_task, ...).
WITH runs AS (
    SELECT r.id, r.created_at
    FROM core_workflowrun r
    WHERE r.id = ANY(%(run_ids)s::uuid[]) AND r.state IN ('succeeded', 'failed', 'cancelled')
    FOR UPDATE SKIP LOCKED
), d_events AS (
    -- The run's partition only (run_created_at); none for a run created before the drop horizon.
    DELETE FROM core_taskrunevent e USING runs
    WHERE e.workflow_run_id = runs.id AND e.run_created_at = runs.created_at               -- uniq_event_run_seq
      AND (%(horizon)s::timestamptz IS NULL OR runs.created_at >= %(horizon)s::timestamptz)
), d_logs AS (
    DELETE FROM core_tasklog l USING runs
    WHERE l.workflow_run_id = runs.id AND l.run_created_at = runs.created_at               -- idx_tasklog_run
      AND (%(horizon)s::timestamptz IS NULL OR runs.created_at >= %(horizon)s::timestamptz)
), d_outbox AS (
    DELETE FROM core_outboxmessage m USING runs WHERE m.workflow_run_id = runs.id
), d_secrets AS (
    DELETE FROM core_attemptsecrets s USING core_taskrun t, runs
    WHERE s.task_run_id = t.id AND t.workflow_run_id = runs.id                           -- uniq_taskrun_per_run_task
), d_payloads AS (
    DELETE FROM core_offloadedpayload p USING runs WHERE p.workflow_run_id = runs.id      -- idx_offloadedpayload_run
), d_keys AS (
    DELETE FROM core_idempotencykey k USING runs WHERE k.workflow_run_id = runs.id
), d_firings AS (
    DELETE FROM core_triggerfiring f USING runs WHERE f.workflow_run_id = runs.id
), d_subscriptions AS (
    DELETE FROM core_runsubscription s USING runs WHERE s.workflow_run_id = runs.id       -- idx_runsub_run_expiry
), d_attempts AS (
    DELETE FROM core_notificationattempt a USING core_notificationdelivery d, core_notificationevent n, runs
    WHERE a.delivery_id = d.id AND d.event_id = n.id AND n.workflow_run_id = runs.id    -- uniq_notifattempt_delivery_number
), d_deliveries AS (
    DELETE FROM core_notificationdelivery d USING core_notificationevent n, runs
    WHERE d.event_id = n.id AND n.workflow_run_id = runs.id
), d_notifications AS (
    DELETE FROM core_notificationevent n USING runs WHERE n.workflow_run_id = runs.id
), d_retries AS (
    UPDATE core_workflowrun w SET retry_of_id = NULL
    FROM runs WHERE w.retry_of_id = runs.id AND w.id NOT IN (SELECT id FROM runs)
), d_task_runs AS (
    DELETE FROM core_taskrun t USING runs WHERE t.workflow_run_id = runs.id              -- uniq_taskrun_per_run_task
)
DELETE FROM core_workflowrun r USING runs WHERE r.id = runs.id
RETURNING r.id;


-- name: outbox_purge_published
-- Remove up to limit outbox rows published more than keep_seconds ago (their generation is long dispatched; uniq_outbox_per_taskrun_generation only has to pick the winner of claims racing at once); idx_outbox_created_brin (created before the cutoff, then published before it).
DELETE FROM core_outboxmessage m
WHERE m.id IN (
    SELECT o.id FROM core_outboxmessage o
    WHERE o.created_at < clock_timestamp() - make_interval(secs => %(keep_seconds)s)
      AND o.published_at < clock_timestamp() - make_interval(secs => %(keep_seconds)s)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING m.id;


-- name: run_oldest_per_org
-- Each organization (at most limit, by slug) with its own retention in days (NULL: the deployment's) and the creation of its oldest run kept (NULL: none); idx_wfrun_org_recent (read backwards, one row each).
SELECT o.id, o.slug, o.run_retention_days,
       (SELECT r.created_at FROM core_workflowrun r WHERE r.organization_id = o.id
        ORDER BY r.created_at LIMIT 1) AS oldest
FROM core_organization o
ORDER BY o.slug
LIMIT %(limit)s;
