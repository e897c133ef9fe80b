-- Statements that append to a run's history (core_taskrunevent) and nothing else.
-- Parameters are psycopg's: %(name)s.


-- name: event_append
-- One event of the run (run), numbered by bumping the run's event counter (its row locked to the commit); core_workflowrun_pkey.
WITH s AS (
    UPDATE core_workflowrun SET last_event_seq = last_event_seq + 1 WHERE id = %(run)s
    RETURNING id, organization_id, last_event_seq
)
INSERT INTO core_taskrunevent
    (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
     attempt, fencing_token, detail, created_at)
SELECT gen_random_uuid(), s.organization_id, s.id, %(tr)s, s.last_event_seq, %(kind)s, %(from)s, %(to)s,
       %(attempt)s, %(token)s, %(detail)s, clock_timestamp()
FROM s
RETURNING seq;
