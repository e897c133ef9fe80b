-- Statements about workflow definitions (core_workflow), run by engine/services.py.
-- Parameters are psycopg's: %(name)s.


-- name: workflow_version_lock
-- Take the transaction-scoped advisory lock on key (a text, 'workflow-version:<org>:<name>') so concurrent applies of one workflow name number their versions in turn; no table or index: a lock on the key's 64-bit hash.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));


-- name: workflow_definition_bytes
-- The bytes of definition text the organization (org) stores, every version of every workflow (used), and the bytes of the new definition (doc, jsonb) as it would be stored (adding); uniq_workflow_name_version (leads with organization_id).
SELECT (SELECT coalesce(sum(octet_length(w.definition::text)), 0)::bigint
        FROM core_workflow w WHERE w.organization_id = %(org)s) AS used,
       octet_length(%(doc)s::jsonb::text)::bigint AS adding;
