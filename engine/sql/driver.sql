-- Statements of the prepared-statement driver (engine/repositories/driver.py).


-- name: planner_index_probes_only
-- For this transaction only (set_config(..., true) is SET LOCAL): plan the hot statements with index probes, no sequential scan, hash or merge join, and no JIT.
-- psycopg keeps each hot statement prepared on its connection and PostgreSQL keeps its plan,
-- so a plan made while a table was nearly empty would read the whole table on every later call.
-- No JIT: a disabled plan node's cost penalty (enable_seqscan off) would otherwise cross
-- jit_above_cost and compile a big statement for seconds, every time it runs.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true), set_config('jit', 'off', true);


-- name: planner_defaults
-- Restore the configured planner settings for the rest of a caller's transaction (after planner_index_probes_only); reads pg_settings.
SELECT set_config(name, reset_val, true) FROM pg_settings WHERE name IN ('enable_seqscan', 'enable_hashjoin', 'enable_mergejoin', 'jit');


-- name: database_now
-- The database's clock (retry instants are the database's, not this host's).
SELECT clock_timestamp();
