-- Rate-limit buckets (core_ratelimitbucket, seed 001's RateLimitBuckets): one row per
-- (organization, key, window size), counted by the fair claim (task_run_claim_fair's one
-- upsert per bucket); pruned here once idle.
--
-- Parameters are psycopg's: %(name)s.


-- name: rate_limit_bucket_purge_batch
-- Delete up to limit buckets whose last window opened more than two minutes ago (closed, idle: the next claim opens a new one); idx_ratelimit_window_start.
DELETE FROM core_ratelimitbucket WHERE id IN (
    SELECT id FROM core_ratelimitbucket
    WHERE window_start < clock_timestamp() - interval '2 minutes'   -- idx_ratelimit_window_start
    ORDER BY window_start
    LIMIT %(limit)s
);


-- name: rate_limit_next_window_close
-- When (epoch seconds) and in how many seconds the first open window of a rate bucket that some ready task run of the shared workers waits on reaches its second half or closes, whichever comes first (NULLs when none), so the scheduler can claim as soon as the bucket has room again (a window's first half admits half its limit: task_run_claim_fair); idx_ratelimit_window_start, idx_taskrun_ready_claim.
SELECT EXTRACT(EPOCH FROM c.closes)::float8, EXTRACT(EPOCH FROM c.closes - clock_timestamp())::float8
FROM (SELECT min(CASE WHEN b.window_start + make_interval(secs => b.window_seconds / 2.0) > clock_timestamp()
                      THEN b.window_start + make_interval(secs => b.window_seconds / 2.0)
                      ELSE b.window_start + make_interval(secs => b.window_seconds) END) AS closes
FROM core_ratelimitbucket b
WHERE b.window_start > clock_timestamp() - interval '61 seconds'        -- idx_ratelimit_window_start
  AND b.window_start + make_interval(secs => b.window_seconds) > clock_timestamp()
  AND EXISTS (SELECT 1 FROM core_taskrun t JOIN core_task k ON k.id = t.task_id
              WHERE t.queue = '' AND t.organization_id = b.organization_id AND t.state = 'ready'  -- idx_taskrun_ready_claim
                AND k.rate_key = b.key AND k.rate_window_seconds = b.window_seconds)) c;
