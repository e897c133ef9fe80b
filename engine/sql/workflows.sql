-- Statements about workflow definitions (core_workflow), run by engine/services.py.
-- Parameters are psycopg's: %(name)s.


-- name: workflow_version_lock
-- Take the transaction-scoped advisory lock on key (a text, 'workflow-version:<org>:<name>') so concurrent applies of one workflow name number their versions in turn; no table or index: a lock on the key's 64-bit hash.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));
