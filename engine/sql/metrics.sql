-- The database gauges of /metrics, run by engine/metrics.py on each scrape. They read
-- task runs, runs and the outbox; each count is served by a state or partial index.
-- No parameters.


-- name: metrics_runs_active
-- Runs pending or running, counted by state; idx_wfrun_state_age (leads with state).
SELECT state, count(*) FROM core_workflowrun WHERE state IN ('pending', 'running') GROUP BY state;


-- name: metrics_task_runs_ready
-- Task runs ready and waiting to be claimed; idx_taskrun_state_age (leads with state).
SELECT count(*) FROM core_taskrun WHERE state = 'ready';


-- name: metrics_task_runs_running
-- Task runs running, and how many of them hold an expired lease; idx_taskrun_state_age (leads with state).
SELECT count(*), count(*) FILTER (WHERE lease_expires_at < clock_timestamp())
FROM core_taskrun WHERE state = 'running';


-- name: metrics_outbox_backlog
-- Outbox rows not yet published nor dead-lettered, and the age in seconds of the oldest (0 when none); idx_outbox_pending (partial: published_at IS NULL).
SELECT count(*), COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)), 0)
FROM core_outboxmessage WHERE published_at IS NULL AND dead_lettered_at IS NULL;


-- name: metrics_outbox_dead_letters
-- Outbox rows dead-lettered after failed publishes; idx_outbox_dead_letter (partial: dead_lettered_at IS NOT NULL).
SELECT count(*) FROM core_outboxmessage WHERE dead_lettered_at IS NOT NULL;
