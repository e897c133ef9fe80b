-- Statements of scheduled triggers (core_scheduledtrigger), run by engine/cron.py.
-- Parameters are psycopg's: %(name)s.


-- name: trigger_list_due
-- The ids of up to limit enabled triggers due at now, soonest first; idx_trigger_due (partial: enabled).
SELECT id FROM core_scheduledtrigger WHERE enabled AND next_fire_at <= %(now)s ORDER BY next_fire_at LIMIT %(limit)s;


-- name: trigger_firing_count_fired
-- How many of the instants (a timestamptz[]) of trigger already have a firing that did not fail (a run, or one being started): a backfill's preview; uniq_triggerfiring_instant (trigger_id, scheduled_for), one probe per instant.
SELECT count(*)::int FROM core_triggerfiring
WHERE trigger_id = %(trigger)s AND scheduled_for = ANY(%(instants)s::timestamptz[]) AND outcome <> 'failed';


-- name: trigger_firing_claim
-- Claim instant of trigger for backfill: a new firing, or one whose start failed taken over (the same key the clock's firings take, so an instant never gets two runs); returns its id, nothing when the instant was already fired; uniq_triggerfiring_instant.
INSERT INTO core_triggerfiring (id, organization_id, trigger_id, scheduled_for, backfill_id, outcome, detail, fired_at)
VALUES (%(id)s, %(org)s, %(trigger)s, %(instant)s, %(backfill)s, 'started', '', clock_timestamp())
ON CONFLICT ON CONSTRAINT uniq_triggerfiring_instant DO UPDATE
SET backfill_id = EXCLUDED.backfill_id, outcome = 'started', detail = '', workflow_run_id = NULL,
    fired_at = EXCLUDED.fired_at
WHERE core_triggerfiring.outcome = 'failed'
RETURNING id;


-- name: trigger_firing_set_run
-- Record the run a claimed firing (id) started; core_triggerfiring_pkey.
UPDATE core_triggerfiring SET workflow_run_id = %(run)s WHERE id = %(id)s;


-- name: trigger_backfill_open_runs
-- How many runs a backfill started are still going (pending or running), for its max_active_runs; idx_firing_backfill, then core_workflowrun_pkey per firing.
SELECT count(*)::int
FROM core_triggerfiring f JOIN core_workflowrun r ON r.id = f.workflow_run_id
WHERE f.backfill_id = %(backfill)s AND r.state IN ('pending', 'running');


-- name: trigger_backfill_list_due
-- The ids of up to limit running backfills that may go on at now, longest waiting first (each pass moves a backfill's not_before to its end, so backfills take turns); idx_backfill_due (partial: running).
SELECT id FROM core_triggerbackfill
WHERE state = 'running' AND not_before <= %(now)s
ORDER BY not_before
LIMIT %(limit)s;


-- name: trigger_lock_for_backfill
-- Lock the trigger of backfill FOR KEY SHARE, before the backfill's own row (the order delete_trigger, edits and the clock's tick lock in: trigger first): a backfill's instant and the clock's firings of one trigger never interleave (each would wait on the other's unique firing otherwise); returns (enabled, next_fire_at), nothing once the trigger is gone; core_triggerbackfill_pkey, core_scheduledtrigger_pkey.
SELECT t.enabled, t.next_fire_at
FROM core_scheduledtrigger t
WHERE t.id = (SELECT b.trigger_id FROM core_triggerbackfill b WHERE b.id = %(backfill)s)
FOR KEY SHARE OF t;
