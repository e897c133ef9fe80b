-- Statements of the outbox relay (core_outboxmessage), run by engine/relay.py (and the
-- reaper's scan of dead letters, outbox_list_dead_lettered_undelivered, engine/reaper.py).
-- The outbox rows themselves are written by the claims in task_runs.sql.
-- Parameters are psycopg's: %(name)s.
--
-- The relay's own transaction, outside a caller's, takes two round trips: the
-- *_begin_* script opens it (without waiting for a WAL flush at commit: a stamp lost in
-- a crash only publishes a row again, and a worker starts each generation at most once)
-- and locks the rows; the *_commit script stamps them and commits. Inside a caller's
-- transaction the plain statements run instead.


-- name: outbox_get_pending
-- Lock up to limit deliverable outbox rows (unpublished, not dead-lettered, not reserved), oldest first, skipping rows another relay holds; idx_outbox_pending (partial: published_at IS NULL).
SELECT id, routing_key, payload FROM core_outboxmessage
WHERE published_at IS NULL AND dead_lettered_at IS NULL
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
ORDER BY created_at                          -- idx_outbox_pending (partial: published_at IS NULL)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;


-- name: outbox_get_pending_among
-- outbox_get_pending restricted to the outbox rows in ids; idx_outbox_pending (partial: published_at IS NULL).
SELECT id, routing_key, payload FROM core_outboxmessage
WHERE published_at IS NULL AND dead_lettered_at IS NULL
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
  AND id = ANY(%(ids)s)
ORDER BY created_at                          -- idx_outbox_pending (partial: published_at IS NULL)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;


-- name: outbox_stamp_published
-- Stamp the outbox rows in ok as published (the broker accepted them); core_outboxmessage_pkey.
-- "Not yet published" is written COALESCE(published_at, 'infinity') = 'infinity' in the
-- stamps: as "published_at IS NULL" it matched idx_outbox_pending's predicate, and with
-- statistics that saw few pending rows the plan read the whole pending index (every row of
-- a backlog, and every entry an earlier stamp left dead) to stamp a few rows by id.
UPDATE core_outboxmessage
SET published_at = clock_timestamp(), publish_attempts = publish_attempts + 1, next_attempt_at = NULL
WHERE id = ANY(%(ok)s) AND COALESCE(published_at, 'infinity') = 'infinity';


-- name: outbox_stamp_failed
-- Record a failed publish of each row in (failed, errs): next try after LEAST(cap, base * 2^attempts) seconds, dead-lettered at max attempts; core_outboxmessage_pkey.
UPDATE core_outboxmessage o
SET publish_attempts = o.publish_attempts + 1, last_error = f.err,
    next_attempt_at = clock_timestamp() + make_interval(
        secs => LEAST(%(cap)s, %(base)s * power(2, o.publish_attempts))),
    dead_lettered_at = CASE WHEN o.publish_attempts + 1 >= %(max)s
                            THEN clock_timestamp() ELSE NULL END
FROM unnest(%(failed)s::uuid[], %(errs)s::text[]) AS f(id, err)
WHERE o.id = f.id;


-- name: outbox_begin_get_pending
-- Open the relay's transaction (no wait for the WAL flush at commit) and lock its rows as outbox_get_pending does; idx_outbox_pending (partial: published_at IS NULL).
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT id, routing_key, payload FROM core_outboxmessage
WHERE published_at IS NULL AND dead_lettered_at IS NULL
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
ORDER BY created_at                          -- idx_outbox_pending (partial: published_at IS NULL)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;


-- name: outbox_begin_get_pending_among
-- Open the relay's transaction as outbox_begin_get_pending, for the outbox rows in ids only; idx_outbox_pending (partial: published_at IS NULL).
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT id, routing_key, payload FROM core_outboxmessage
WHERE published_at IS NULL AND dead_lettered_at IS NULL
  AND (next_attempt_at IS NULL OR next_attempt_at <= clock_timestamp())
  AND id = ANY(%(ids)s)
ORDER BY created_at                          -- idx_outbox_pending (partial: published_at IS NULL)
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;


-- name: outbox_stamp_published_commit
-- outbox_stamp_published, then COMMIT the relay's transaction; core_outboxmessage_pkey.
UPDATE core_outboxmessage
SET published_at = clock_timestamp(), publish_attempts = publish_attempts + 1, next_attempt_at = NULL
WHERE id = ANY(%(ok)s) AND COALESCE(published_at, 'infinity') = 'infinity';
COMMIT;


-- name: outbox_stamp_failed_commit
-- outbox_stamp_failed, then COMMIT the relay's transaction; core_outboxmessage_pkey.
UPDATE core_outboxmessage o
SET publish_attempts = o.publish_attempts + 1, last_error = f.err,
    next_attempt_at = clock_timestamp() + make_interval(
        secs => LEAST(%(cap)s, %(base)s * power(2, o.publish_attempts))),
    dead_lettered_at = CASE WHEN o.publish_attempts + 1 >= %(max)s
                            THEN clock_timestamp() ELSE NULL END
FROM unnest(%(failed)s::uuid[], %(errs)s::text[]) AS f(id, err)
WHERE o.id = f.id;
COMMIT;


-- name: outbox_stamp_published_async
-- outbox_stamp_published in a transaction of its own that does not wait for the WAL flush (a publish of just-claimed rows); core_outboxmessage_pkey.
BEGIN;
SET LOCAL synchronous_commit = off;
UPDATE core_outboxmessage
SET published_at = clock_timestamp(), publish_attempts = publish_attempts + 1, next_attempt_at = NULL
WHERE id = ANY(%(ok)s) AND COALESCE(published_at, 'infinity') = 'infinity';
COMMIT;


-- name: outbox_list_dead_lettered_undelivered
-- Up to limit dead-lettered outbox rows whose generation is still claimed and never started (task run id, token, publish attempts, last error), for the reaper to fail; idx_outbox_dead_letter (partial: dead_lettered_at IS NOT NULL), then core_taskrun_pkey.
SELECT o.task_run_id, o.fencing_token_snapshot, o.publish_attempts, o.last_error
FROM core_outboxmessage o JOIN core_taskrun t ON t.id = o.task_run_id
WHERE o.dead_lettered_at IS NOT NULL AND t.state = 'running'
  AND t.fencing_token = o.fencing_token_snapshot
  AND t.started_fencing_token IS DISTINCT FROM t.fencing_token
LIMIT %(limit)s;
