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


-- name: metrics_table_sizes
-- Bytes on disk (table, its indexes and TOAST; a partitioned table's partitions summed) of the tables that grow with history (issue 21: retention keeps them bounded); the catalog, no table read.
SELECT t.name, COALESCE((SELECT sum(pg_total_relation_size(p.relid))::bigint FROM pg_partition_tree(t.name::regclass) p),
                        pg_total_relation_size(t.name::regclass))
FROM unnest(ARRAY['core_workflowrun', 'core_taskrun', 'core_taskrunevent', 'core_tasklog', 'core_outboxmessage',
                  'core_offloadedpayload', 'core_triggerfiring', 'core_notificationevent',
                  'core_notificationdelivery', 'core_auditlog']) AS t(name);


-- name: metrics_history_partitions
-- Per history table, its partitions from the current period on (created ahead; the manager keeps FLOWFORGE_HISTORY_PARTITIONS_AHEAD) and in all; the catalog (pg_inherits).
SELECT p.relname,
       count(*) FILTER (WHERE (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
                              > statement_timestamp()) AS ahead,
       count(*) AS total
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname IN ('core_taskrunevent', 'core_tasklog') AND p.relnamespace = 'public'::regnamespace
GROUP BY p.relname
ORDER BY p.relname;


-- name: metrics_retention
-- The age in seconds of the oldest run kept (one probe per state, idx_wfrun_state_age) and of the purge's lag: how long past its organization's retention the oldest finished run still kept is (0 when none; per organization its oldest old run, idx_wfrun_org_recent), with default_seconds the deployment's retention in seconds.
SELECT
    COALESCE((SELECT EXTRACT(EPOCH FROM clock_timestamp() - min(m.oldest))
              FROM unnest(ARRAY['pending', 'running', 'succeeded', 'failed', 'cancelled']) AS s(state)
              CROSS JOIN LATERAL (SELECT min(r.created_at) AS oldest FROM core_workflowrun r
                                  WHERE r.state = s.state) m), 0),
    COALESCE((SELECT max(EXTRACT(EPOCH FROM (clock_timestamp()
                                             - make_interval(secs => COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s)))
                                            - l.finished_at))
              FROM core_organization o
              CROSS JOIN LATERAL (
                  SELECT r.finished_at FROM core_workflowrun r
                  WHERE r.organization_id = o.id
                    AND r.created_at < clock_timestamp() - make_interval(secs => COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s))
                    AND r.finished_at < clock_timestamp() - make_interval(secs => COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s))
                    AND r.state IN ('succeeded', 'failed', 'cancelled')
                  ORDER BY r.created_at
                  LIMIT 1) l
              WHERE COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s) > 0), 0);
