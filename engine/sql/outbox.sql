-- Statements of the outbox relay (core_outboxmessage). engine/relay.py still holds its own
-- copies of these (_PENDING_SQL, _STAMP_OK_SQL, _STAMP_FAILED_SQL) until it loads them from here.
-- The outbox rows themselves are written by the claims in task_runs.sql.
-- Parameters are psycopg's: %(name)s.


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
UPDATE core_outboxmessage
SET published_at = clock_timestamp(), publish_attempts = publish_attempts + 1, next_attempt_at = NULL
WHERE id = ANY(%(ok)s) AND published_at IS NULL;


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
