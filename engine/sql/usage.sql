-- An organization's usage of its quotas (issue 16), as the quota checks count it: shown on
-- its settings page and at GET /api/v1/org/limits/.
--
-- Parameters are psycopg's: %(name)s.


-- name: organization_usage
-- The organization's (org) running task runs (claimed or started), runs created in the last window seconds and stored definition bytes (every version, JSON text), in one round trip; idx_taskrun_running_org, idx_wfrun_org_recent, uniq_workflow_name_version.
SELECT (SELECT count(*) FROM core_taskrun
        WHERE organization_id = %(org)s AND state = 'running')::bigint AS running_task_runs,
       (SELECT count(*) FROM core_workflowrun
        WHERE organization_id = %(org)s
          AND created_at > clock_timestamp() - make_interval(secs => %(window)s))::bigint AS runs_last_window,
       (SELECT coalesce(sum(octet_length(w.definition::text)), 0)
        FROM core_workflow w WHERE w.organization_id = %(org)s)::bigint AS definition_bytes;
