-- Statements of scheduled triggers (core_scheduledtrigger), run by engine/cron.py.
-- Parameters are psycopg's: %(name)s.


-- name: trigger_list_due
-- The ids of up to limit enabled triggers due at now, soonest first; idx_trigger_due (partial: enabled).
SELECT id FROM core_scheduledtrigger WHERE enabled AND next_fire_at <= %(now)s ORDER BY next_fire_at LIMIT %(limit)s;
