-- Statements of live listeners' run subscriptions (core_runsubscription), run by
-- engine/live.py on a listener's own autocommit connection (purge: the clock's).
-- Parameters are psycopg's: %(name)s.


-- name: subscription_upsert
-- Subscribe (id) to the events of run (run) for secs seconds, or extend the row id if it still exists; core_runsubscription_pkey (the ON CONFLICT target).
INSERT INTO core_runsubscription (id, organization_id, workflow_run_id, expires_at)
VALUES (%(id)s, %(org)s, %(run)s, now() + make_interval(secs => %(secs)s))
ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at;


-- name: subscription_renew_many
-- Extend the subscriptions ids by secs seconds, returning the ids that still exist; core_runsubscription_pkey.
UPDATE core_runsubscription SET expires_at = now() + make_interval(secs => %(secs)s)
WHERE id = ANY(%(ids)s) RETURNING id;


-- name: subscription_delete_many
-- Delete the subscriptions ids; core_runsubscription_pkey.
DELETE FROM core_runsubscription WHERE id = ANY(%(ids)s);


-- name: subscription_purge_expired
-- Delete the subscriptions expired for over a minute (listeners that died); a sequential scan: the table holds one row per live listener, and no index leads with expires_at (idx_runsub_run_expiry leads with workflow_run_id, for the NOTIFY trigger's probe).
DELETE FROM core_runsubscription WHERE expires_at < now() - interval '1 minute';
