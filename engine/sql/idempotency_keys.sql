-- Statements of Idempotency-Key rows (core_idempotencykey), run by
-- engine/services.py (start_run_idempotent, purge_expired_idempotency_keys).
-- Parameters are psycopg's: %(name)s.


-- name: idempotency_key_claim
-- Insert the key of (org, user, key) with request_hash and no run yet, expiring in ttl seconds, unless a row holds it already (then no row is returned); uniq_idempotency_org_user_key (NULLS NOT DISTINCT).
INSERT INTO core_idempotencykey
    (id, organization_id, user_id, api_key_id, key, request_hash, workflow_run_id,
     created_at, expires_at)
VALUES (%(id)s, %(org)s, %(user)s, %(api_key)s, %(key)s, %(request_hash)s, NULL, now(),
        now() + make_interval(secs => %(ttl)s))
ON CONFLICT ON CONSTRAINT uniq_idempotency_org_user_key DO NOTHING
RETURNING id;


-- name: idempotency_key_set_run
-- Record run as the run the claimed key id started; core_idempotencykey_pkey.
UPDATE core_idempotencykey SET workflow_run_id = %(run)s WHERE id = %(id)s;


-- name: idempotency_key_get
-- The row holding the key of (org, user, key), NULL users equal like the constraint, with whether it has expired; uniq_idempotency_org_user_key.
SELECT id, request_hash, workflow_run_id, expires_at < now()
FROM core_idempotencykey
WHERE organization_id = %(org)s AND user_id IS NOT DISTINCT FROM %(user)s AND key = %(key)s;


-- name: idempotency_key_delete_expired
-- Delete the key row id if it has expired; core_idempotencykey_pkey.
DELETE FROM core_idempotencykey WHERE id = %(id)s AND expires_at < now();


-- name: idempotency_key_purge_expired_batch
-- Delete up to limit expired key rows, oldest expiry first, skipping rows another transaction holds; idx_idempotency_expiry.
DELETE FROM core_idempotencykey WHERE id IN (
    SELECT id FROM core_idempotencykey WHERE expires_at < now()
    ORDER BY expires_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);
