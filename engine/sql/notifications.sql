-- Statements of the notifications' outbox (issue 19): core_notificationdelivery (one row per
-- notification and target: a webhook endpoint or a member's email) and its attempts
-- (core_notificationattempt). Rows are written by the ff_notification_record trigger
-- (migration 0028) in the transaction of the transition that caused them; these statements
-- claim, record, give back and expire them (engine.repositories.notifications).
-- A target is coalesce(endpoint_id, recipient_id): the endpoint, or the email's recipient.
-- Parameters are psycopg's: %(name)s.


-- name: notification_claim_lock
-- Take the transaction-scoped advisory lock of the notification claim, so the in-flight counts of notification_delivery_claim are exact between claimers; no table: a lock on the key's 64-bit hash.
SELECT pg_advisory_xact_lock(hashtextextended('notification-claim', 0));


-- name: notification_delivery_claim
-- Claim due pending deliveries, round robin between organizations, within the in-flight caps deployment-wide (limit), per organization (per_org) and per target (per_target); pending -> sending with a lease of lease seconds, attempts + 1, claim_token + 1; a disabled endpoint's rows wait; returns (id, claim_token); idx_notifdelivery_pending (a loose scan over the targets with pending rows, then each one's due rows oldest first), idx_notifdelivery_sending (what is in flight). Run after notification_claim_lock, in its transaction.
WITH RECURSIVE targets(target) AS (
    -- One index probe per target with pending rows: a backlog of one target (a slow or
    -- dead receiver) is never read past, so it cannot keep another's rows from the claim.
    (SELECT coalesce(d.endpoint_id, d.recipient_id) FROM core_notificationdelivery d
     WHERE d.state = 'pending'
     ORDER BY coalesce(d.endpoint_id, d.recipient_id) LIMIT 1)
    UNION ALL
    SELECT (SELECT coalesce(d.endpoint_id, d.recipient_id) FROM core_notificationdelivery d
            WHERE d.state = 'pending' AND coalesce(d.endpoint_id, d.recipient_id) > t.target
            ORDER BY coalesce(d.endpoint_id, d.recipient_id) LIMIT 1)
    FROM targets t WHERE t.target IS NOT NULL
), busy AS (
    SELECT b.organization_id, coalesce(b.endpoint_id, b.recipient_id) AS target
    FROM core_notificationdelivery b
    WHERE b.state = 'sending' AND b.lease_expires_at > clock_timestamp()
), due AS (
    SELECT c.id, c.organization_id, c.target, c.next_attempt_at,
           row_number() OVER (PARTITION BY c.target ORDER BY c.next_attempt_at, c.id) AS target_rank
    FROM targets t
    CROSS JOIN LATERAL (
        SELECT d.id, d.organization_id, coalesce(d.endpoint_id, d.recipient_id) AS target, d.next_attempt_at
        FROM core_notificationdelivery d
        WHERE d.state = 'pending' AND coalesce(d.endpoint_id, d.recipient_id) = t.target
          AND d.next_attempt_at <= clock_timestamp()
        ORDER BY coalesce(d.endpoint_id, d.recipient_id), d.next_attempt_at
        LIMIT %(per_target)s
    ) c
    WHERE t.target IS NOT NULL
      -- A probe of core_webhookendpoint_pkey per target (an email's recipient matches none).
      AND coalesce((SELECT e.enabled FROM core_webhookendpoint e WHERE e.id = t.target), true)
), fits_target AS (
    SELECT d.* FROM due d
    WHERE d.target_rank + (SELECT count(*) FROM busy b WHERE b.target = d.target) <= %(per_target)s
), ranked AS (
    SELECT f.*, row_number() OVER (PARTITION BY f.organization_id ORDER BY f.next_attempt_at, f.id) AS org_rank
    FROM fits_target f
), picked AS (
    SELECT r.id FROM ranked r
    WHERE r.org_rank + (SELECT count(*) FROM busy b WHERE b.organization_id = r.organization_id) <= %(per_org)s
    -- Each organization's oldest first, then each one's second oldest, ...: round robin.
    ORDER BY r.org_rank, r.next_attempt_at, r.id
    LIMIT greatest(%(limit)s - (SELECT count(*) FROM busy), 0)
)
UPDATE core_notificationdelivery d
SET state = 'sending', attempts = d.attempts + 1, claim_token = d.claim_token + 1, next_attempt_at = NULL,
    lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s)
FROM picked p
WHERE d.id = p.id AND d.state = 'pending'
RETURNING d.id, d.claim_token;


-- name: notification_delivery_get_claimed
-- The claimed delivery (id, claim token token) with what sending it needs: channel, attempt number, its event (id, type, payload, created_at, run, workflow name), the endpoint (url, secret ciphertexts, whether the previous secret still signs) or the recipient (email, whether still a member), the organization's name; no row when the claim is no longer current; core_notificationdelivery_pkey.
SELECT d.id, d.organization_id, d.channel, d.attempts,
       ev.id, ev.type, ev.payload, ev.created_at, ev.workflow_run_id, ev.workflow_name,
       w.id, w.url, w.secret_ciphertext, w.previous_secret_ciphertext,
       coalesce(w.previous_secret_expires_at > clock_timestamp(), false),
       u.id, u.email,
       EXISTS (SELECT 1 FROM core_membership m WHERE m.organization_id = d.organization_id AND m.user_id = d.recipient_id),
       o.name
FROM core_notificationdelivery d
JOIN core_notificationevent ev ON ev.id = d.event_id
JOIN core_organization o ON o.id = d.organization_id
LEFT JOIN core_webhookendpoint w ON w.id = d.endpoint_id
LEFT JOIN core_user u ON u.id = d.recipient_id
WHERE d.id = %(id)s AND d.state = 'sending' AND d.claim_token = %(token)s;


-- name: notification_delivery_record
-- Record the claimed attempt (id, claim token token): succeeded (ok); else failed, back to pending after a jittered exponential backoff (base * 2^(attempts - 1) seconds, at most cap, times 0.5 to 1) while retryable and attempts < max, dead otherwise; with its attempt row (started, ms, status, error, response excerpt, truncated); returns (state, next_attempt_at), no row when the claim is no longer current; core_notificationdelivery_pkey.
WITH upd AS (
    UPDATE core_notificationdelivery d
    SET state = CASE WHEN %(ok)s THEN 'succeeded'
                     WHEN %(retryable)s AND d.attempts < %(max)s THEN 'pending' ELSE 'dead' END,
        next_attempt_at = CASE WHEN NOT %(ok)s AND %(retryable)s AND d.attempts < %(max)s
            THEN clock_timestamp() + make_interval(
                secs => LEAST(%(cap)s, %(base)s * power(2, d.attempts - 1)) * (0.5 + random() / 2)) END,
        delivered_at = CASE WHEN %(ok)s THEN clock_timestamp() END,
        dead_lettered_at = CASE WHEN NOT %(ok)s AND NOT (%(retryable)s AND d.attempts < %(max)s)
            THEN clock_timestamp() END,
        lease_expires_at = NULL, last_status = %(status)s, last_error = %(error)s
    WHERE d.id = %(id)s AND d.state = 'sending' AND d.claim_token = %(token)s
    RETURNING d.id, d.organization_id, d.attempts, d.state, d.next_attempt_at
), att AS (
    INSERT INTO core_notificationattempt
        (organization_id, delivery_id, number, outcome, retrying, started_at, duration_ms, status_code, error,
         response_excerpt, response_truncated)
    SELECT u.organization_id, u.id, u.attempts, CASE WHEN %(ok)s THEN 'succeeded' ELSE 'failed' END,
           u.state = 'pending', %(started)s, %(ms)s, %(status)s, %(error)s, %(excerpt)s, %(truncated)s
    FROM upd u
)
SELECT state, next_attempt_at FROM upd;


-- name: notification_delivery_release
-- Give back claimed deliveries (ids, tokens) whose message the broker refused: sending -> pending, due now, the attempt not counted; core_notificationdelivery_pkey.
UPDATE core_notificationdelivery d
SET state = 'pending', attempts = d.attempts - 1, next_attempt_at = clock_timestamp(), lease_expires_at = NULL
FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS r(id, token)
WHERE d.id = r.id AND d.state = 'sending' AND d.claim_token = r.token;


-- name: notification_delivery_expire
-- Up to limit deliveries claimed but not recorded before their lease expired (the worker was lost): back to pending after the jittered backoff of notification_delivery_record while attempts < max, else dead; an attempt row each with error; returns their ids; idx_notifdelivery_sending.
WITH lost AS (
    SELECT l.id FROM core_notificationdelivery l
    WHERE l.state = 'sending' AND l.lease_expires_at < statement_timestamp()
    ORDER BY l.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE core_notificationdelivery d
    SET state = CASE WHEN d.attempts < %(max)s THEN 'pending' ELSE 'dead' END,
        next_attempt_at = CASE WHEN d.attempts < %(max)s
            THEN clock_timestamp() + make_interval(
                secs => LEAST(%(cap)s, %(base)s * power(2, d.attempts - 1)) * (0.5 + random() / 2)) END,
        dead_lettered_at = CASE WHEN d.attempts < %(max)s THEN NULL ELSE clock_timestamp() END,
        lease_expires_at = NULL, last_status = NULL, last_error = %(error)s
    FROM lost l
    WHERE d.id = l.id AND d.state = 'sending'
    RETURNING d.id, d.organization_id, d.attempts, d.state
)
INSERT INTO core_notificationattempt
    (organization_id, delivery_id, number, outcome, retrying, started_at, duration_ms, status_code, error,
     response_excerpt, response_truncated)
SELECT u.organization_id, u.id, u.attempts, 'failed', u.state = 'pending', clock_timestamp(), NULL, NULL,
       %(error)s, '', false
FROM upd u
ON CONFLICT (delivery_id, number) DO NOTHING
RETURNING delivery_id;
