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
