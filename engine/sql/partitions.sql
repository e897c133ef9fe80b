-- The history tables' partitions (issue 21; engine.partitions, migration 0033): core_taskrunevent
-- and core_tasklog are range-partitioned on run_created_at (the run's creation). Partitions are
-- created and dropped through two SECURITY DEFINER functions of the migrating role, because the
-- application's role does not own the tables.
-- Parameters are psycopg's: %(name)s.


-- name: history_partitions
-- Every partition of the history tables as (parent, partition, lo, hi), by parent then period; the catalog (pg_inherits, relpartbound).
SELECT p.relname AS parent, c.relname AS part,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)'))[1]::timestamptz AS lo,
       (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)'))[2]::timestamptz AS hi
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname IN ('core_taskrunevent', 'core_tasklog') AND p.relnamespace = 'public'::regnamespace
ORDER BY 1, 3;


-- name: history_partition_create
-- Create the partition of parent for [lo, hi): its name, or NULL when another manager created it (or one overlapping it) first; ff_history_partition_create (migration 0033).
SELECT ff_history_partition_create(%(parent)s, %(lo)s, %(hi)s);


-- name: history_partition_drop
-- Drop a history partition whose period is over and holds no kept run's history: true, or false when a run created in its period remains or its parent's lock was not had within 200 ms; ff_history_partition_drop (migration 0033), idx_wfrun_org_recent.
SELECT ff_history_partition_drop(%(part)s);


-- name: history_retention_longest
-- The longest run retention in force, in seconds (each organization's, else default_seconds), and whether any organization keeps runs forever (0); core_organization.
SELECT COALESCE(bool_or(COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s) = 0), %(default_seconds)s = 0) AS forever,
       GREATEST(COALESCE(max(COALESCE(o.run_retention_days * 86400.0, %(default_seconds)s)), 0), %(default_seconds)s) AS longest
FROM core_organization o;
