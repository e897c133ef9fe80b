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
