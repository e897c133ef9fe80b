-- Rate-limit buckets (core_ratelimitbucket, seed 001's RateLimitBuckets): counted by the
-- fair claim (task_run_claim_fair's one upsert per bucket and window); pruned here.
--
-- Parameters are psycopg's: %(name)s.


-- name: rate_limit_bucket_purge_batch
-- Delete up to limit buckets whose window ended more than a minute ago (a claim only ever reads its current window); idx_ratelimit_window_start.
DELETE FROM core_ratelimitbucket WHERE id IN (
    SELECT id FROM core_ratelimitbucket
    WHERE window_start < clock_timestamp() - interval '2 minutes'   -- idx_ratelimit_window_start
    ORDER BY window_start
    LIMIT %(limit)s
);
