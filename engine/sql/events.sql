-- Statements that append to a run's history (core_taskrunevent) and nothing else.
-- Two triggers act on each row appended (whichever statement appends it): ff_taskrunevent_notify
-- (NOTIFY for live listeners, migrations 0006-0007) and ff_notification_record (a run's
-- 'run_finished' and a task run's move into 'failed' recorded as notifications, migration 0028).
-- Parameters are psycopg's: %(name)s.


-- name: event_append
-- One event of the run (run), numbered by bumping the run's event counter (its row locked to the commit); core_workflowrun_pkey.
WITH s AS (
    UPDATE core_workflowrun SET last_event_seq = last_event_seq + 1 WHERE id = %(run)s
    RETURNING id, organization_id, last_event_seq, created_at
)
INSERT INTO core_taskrunevent
    (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
     attempt, fencing_token, detail, created_at, run_created_at)
SELECT gen_random_uuid(), s.organization_id, s.id, %(tr)s, s.last_event_seq, %(kind)s, %(from)s, %(to)s,
       %(attempt)s, %(token)s, %(detail)s, clock_timestamp(), s.created_at
FROM s
RETURNING seq;


-- name: event_append_redelivered_many
-- A 'redelivered' event for each generation (ids, tokens) still claimed and not started, whose message was given back to its queue after the worker process that fetched it (consumer) died; detail: consumer and the seconds since the claim ('claimed' event of that token); numbered by bumping each run's counter once; returns (task run id, seconds waited) per event; core_taskrun_pkey, idx_event_taskrun_created, core_workflowrun_pkey.
WITH req AS (
    SELECT DISTINCT r.id, r.token FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS r(id, token)
), gen AS (
    SELECT t.id, t.workflow_run_id, t.organization_id, t.attempt, t.fencing_token,
           (SELECT EXTRACT(EPOCH FROM clock_timestamp() - max(e.created_at))::float8
            FROM core_taskrunevent e
            WHERE e.task_run_id = t.id AND e.kind = 'claimed' AND e.fencing_token = t.fencing_token) AS waited
    FROM req JOIN core_taskrun t ON t.id = req.id
    WHERE t.state = 'running' AND t.fencing_token = req.token
      AND t.started_fencing_token IS DISTINCT FROM t.fencing_token
), tr AS (
    SELECT g.id, g.workflow_run_id, g.organization_id, g.attempt, g.fencing_token, g.waited,
           'redelivered'::text AS ev_kind, 'running'::text AS ev_from, 'running'::text AS ev_to,
           jsonb_build_object('consumer', %(consumer)s::text, 'waited_seconds', round(g.waited::numeric, 3))
               AS ev_detail
    FROM gen g
), ev_rows AS (
    SELECT tr.*, row_number() OVER (PARTITION BY tr.workflow_run_id ORDER BY tr.id) AS rn
    FROM tr
), ev_counts AS (
    SELECT workflow_run_id, count(*) AS n FROM tr GROUP BY workflow_run_id
), ev_seq AS (
    UPDATE core_workflowrun r SET last_event_seq = r.last_event_seq + c.n
    FROM ev_counts c WHERE r.id = c.workflow_run_id
    RETURNING r.id, r.last_event_seq - c.n AS base, r.created_at AS run_created_at
), ev_ins AS (
    INSERT INTO core_taskrunevent
        (id, organization_id, workflow_run_id, task_run_id, seq, kind, from_state, to_state,
         attempt, fencing_token, detail, created_at, run_created_at)
    SELECT gen_random_uuid(), e.organization_id, e.workflow_run_id, e.id, s.base + e.rn, e.ev_kind,
           e.ev_from, e.ev_to, e.attempt, e.fencing_token, e.ev_detail, clock_timestamp(), s.run_created_at
    FROM ev_rows e JOIN ev_seq s ON s.id = e.workflow_run_id
)
SELECT e.id, e.waited FROM ev_rows e JOIN ev_seq s ON s.id = e.workflow_run_id;


-- name: event_stale_completion_recorded
-- Whether a stale_completion_rejected event of the task run id already records a completion of generation token with outcome (a worker replaying a refused call records it once); idx_event_taskrun_created.
SELECT EXISTS (SELECT 1 FROM core_taskrunevent e
               WHERE e.task_run_id = %(id)s AND e.kind = 'stale_completion_rejected' AND e.fencing_token = %(token)s
                 AND e.detail->>'outcome' = %(outcome)s);
