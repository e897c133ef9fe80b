-- Statements of the attempts' log lines (core_tasklog, issue 19) that the shared workers
-- write and the task detail reads. The lines the organizations' own workers send are
-- worker_queues.sql's (task_log_append, capped there in SQL); the run page's worker log
-- tails are too (task_log_run_tail).
--
-- Parameters are psycopg's: %(name)s.


-- name: task_log_append_many
-- Append lines a shared worker captured from its attempts (one array element per line: the task run, its organization and run, attempt, generation token, stream, level, message and when it was written), in order, each with its run's created_at (the partition key); the caller caps and redacts them; core_tasklog_pkey (its sequence is the order), core_workflowrun_pkey.
INSERT INTO core_tasklog (organization_id, workflow_run_id, task_run_id, attempt, fencing_token, stream, level, message,
                          created_at, run_created_at)
SELECT l.org, l.run, l.task_run, l.attempt, l.token, l.stream, l.level, l.message, l.at, r.created_at
FROM unnest(%(orgs)s::uuid[], %(runs)s::uuid[], %(task_runs)s::uuid[], %(attempts)s::int[], %(tokens)s::bigint[],
            %(streams)s::text[], %(levels)s::text[], %(messages)s::text[], %(ats)s::timestamptz[])
     WITH ORDINALITY AS l(org, run, task_run, attempt, token, stream, level, message, at, n)
JOIN core_workflowrun r ON r.id = l.run  -- core_workflowrun_pkey: the partition key
ORDER BY l.n;


-- name: task_log_attempt_tails
-- The log lines of the organization's task run id for each generation in tokens: its last lines (at most limit), as (fencing_token, id, attempt, stream, level, message, created_at), by generation then oldest first; idx_tasklog_taskrun (read backwards, once per generation).
SELECT g.token, y.id, y.attempt, y.stream, y.level, y.message, y.created_at
FROM unnest(%(tokens)s::bigint[]) AS g(token)
CROSS JOIN LATERAL (
    SELECT x.id, x.attempt, x.stream, x.level, x.message, x.created_at FROM core_tasklog x
    WHERE x.task_run_id = %(id)s AND x.organization_id = %(org)s AND x.fencing_token = g.token
      AND x.run_created_at = (SELECT r.created_at FROM core_taskrun t JOIN core_workflowrun r   -- its partition only
                              ON r.id = t.workflow_run_id WHERE t.id = %(id)s)
    ORDER BY x.id DESC LIMIT %(limit)s                                            -- idx_tasklog_taskrun
) y
ORDER BY g.token, y.id;
