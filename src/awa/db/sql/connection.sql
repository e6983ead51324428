-- Statements about the connection itself: pooler detection and the LISTEN ping.

-- name: connection_backend_pid
-- Differs from the process id announced at connection start only when a
-- pooler sits between the client and the server.
SELECT pg_backend_pid()

-- name: connection_ping
-- The LISTEN connection's liveness probe (a half-open connection times out).
SELECT 1

-- name: connection_database_exists
-- Whether a database of this name exists on the server (the test fixture's own).
SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)

-- name: connection_end_stalled
-- End the sessions of this database named one of $1 (the runtime's own pools'
-- application_name) that have waited for their client in the middle of a
-- statement for longer than $2 (the runtime's statement timeout, after which
-- their client has given up on it): the pids ended, who, and for how long.
-- Such a session is one whose client vanished between two messages of one
-- statement (asyncpg prepares a statement with Parse, Describe and Flush, and
-- sends Bind, Execute and Sync once the server has answered): a half-open
-- connection. Waiting there, PostgreSQL arms neither the statement timeout nor
-- idle_in_transaction_session_timeout, and ignores a cancel request, so a
-- transaction caught there would hold its locks (the closures of a completion
-- batch, the rows of a rescue) as long as the TCP connection lives: for ever,
-- behind a proxy or NAT that keeps acknowledging. Only sessions this role may
-- signal are read (pg_terminate_backend refuses the others).
SELECT a.pid, a.application_name,
       date_part('epoch', now() - a.state_change)::float8 AS stalled_s,
       a.backend_xid IS NOT NULL AS in_write, pg_terminate_backend(a.pid) AS ended
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.application_name = ANY($1::text[])
  AND a.state = 'active' AND a.wait_event_type = 'Client' AND a.wait_event = 'ClientRead'
  AND a.state_change < now() - $2::interval
  AND pg_has_role(a.usesysid, 'USAGE')
  AND (NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.oid = a.usesysid)
       OR (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user))
