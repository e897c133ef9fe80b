-- The database gauges of /metrics, run by engine/metrics.py on each scrape. They read
-- task runs, runs and the outbox; each count is served by a state or partial index.
-- No parameters, but metrics_task_runs_by_org's %(top)s.


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


-- name: metrics_task_runs_by_org
-- Ready and running task runs per organization, the top %(top)s organizations by ready + running labelled by slug and the rest summed as '(others)', a label no slug can take (bounded label cardinality); idx_taskrun_ready_claim (partial: ready) and idx_taskrun_running_org (partial: running), both leading with organization_id.
WITH ready AS (
    SELECT organization_id, count(*) AS n FROM core_taskrun WHERE state = 'ready' GROUP BY organization_id
), running AS (
    SELECT organization_id, count(*) AS n FROM core_taskrun WHERE state = 'running' GROUP BY organization_id
), per_org AS (
    SELECT COALESCE(r.organization_id, u.organization_id) AS org,
           COALESCE(r.n, 0) AS ready, COALESCE(u.n, 0) AS running
    FROM ready r FULL JOIN running u ON u.organization_id = r.organization_id
), ranked AS (
    SELECT p.*, row_number() OVER (ORDER BY p.ready + p.running DESC, p.org) AS rank FROM per_org p
)
SELECT CASE WHEN k.rank <= %(top)s THEN o.slug ELSE '(others)' END AS org, sum(k.ready), sum(k.running)
FROM ranked k JOIN core_organization o ON o.id = k.org
GROUP BY 1
ORDER BY min(k.rank);
