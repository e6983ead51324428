"""Job states, the sets derived from them, and every limit and default.

Defined once here and imported everywhere (producer, runtime, admin, SQL
parameters) so the rules cannot drift apart.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta


class JobState(enum.Enum):
    """A job's lifecycle state; ``str()`` gives the lowercase database name."""

    Scheduled = "scheduled"
    Available = "available"
    Running = "running"
    Completed = "completed"
    Retryable = "retryable"
    Failed = "failed"
    Cancelled = "cancelled"
    WaitingExternal = "waiting_external"

    def __str__(self) -> str:
        return self.value

    @property
    def bit(self) -> int:
        """This state's bit in a unique-options ``states`` bitmask."""
        return 1 << STATE_ORDER.index(self)

    @classmethod
    def parse(cls, value: JobState | str) -> JobState:
        """Accept a member or its lowercase/CamelCase name."""
        if isinstance(value, JobState):
            return value
        for member in cls:
            if value in (member.value, member.name):
                return member
        from awa.core.errors import ValidationError

        raise ValidationError("state", f"unknown job state {value!r}")


#: Bit order of the unique ``states`` bitmask (bit 0 = scheduled, in `JobState` order).
STATE_ORDER: tuple[JobState, ...] = tuple(JobState)

_S = JobState
#: Every state change the runtime and maintenance make: a state →
#: the states it may move to. The SQL statements carry these out; the sets
#: below are read off this table, so the two cannot drift apart.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.Scheduled: frozenset({_S.Available, _S.Cancelled}),        # promoted when due; cancel
    _S.Retryable: frozenset({_S.Available, _S.Cancelled}),        # promoted when due; cancel
    _S.Available: frozenset({_S.Running, _S.Cancelled}),          # claimed; cancel
    _S.Running: frozenset({_S.Completed, _S.Retryable, _S.Failed,  # the handler's outcome,
                           _S.Scheduled, _S.Cancelled,             # snooze, cancel, rescue
                           _S.WaitingExternal}),                   # a callback wait
    _S.WaitingExternal: frozenset({_S.Running, _S.Completed, _S.Failed,  # resume, resolve,
                                   _S.Available, _S.Retryable,          # retry, timeout
                                   _S.Cancelled}),
    _S.Completed: frozenset(), _S.Failed: frozenset(), _S.Cancelled: frozenset(),
}
#: What an operator may do besides (admin ``retry``: back to available, attempt 0).
ADMIN_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.Failed: frozenset({_S.Available}),
    _S.Cancelled: frozenset({_S.Available}),
    _S.WaitingExternal: frozenset({_S.Available}),
}

#: States no handler or maintenance pass ever leaves (rows of ``jobs_done``).
TERMINAL: frozenset[JobState] = frozenset(s for s, to in TRANSITIONS.items() if not to)
#: States whose rows live in the active table and may still run.
ACTIVE: frozenset[JobState] = frozenset(set(JobState) - TERMINAL)
#: Waiting to run, held by no handler: claimable now, or promoted to claimable
#: when due (what `drain_queue`, admin cancel and batch operations act on).
QUEUED: frozenset[JobState] = frozenset(
    s for s, to in TRANSITIONS.items() if to == {_S.Available, _S.Cancelled}) | {_S.Available}
#: States an admin `retry` may move back to available.
RETRYABLE_BY_ADMIN: frozenset[JobState] = frozenset(
    s for s, to in ADMIN_TRANSITIONS.items() if _S.Available in to)


def can_transition(source: JobState, target: JobState, *, admin: bool = False) -> bool:
    """Whether Awa ever moves a job from ``source`` to ``target`` (``admin``: an operator's)."""
    return target in TRANSITIONS[source] or (
        admin and target in ADMIN_TRANSITIONS.get(source, frozenset()))

# -- limits (docs/guide/configuration.md lists them) -------------------------
PRIORITY_MIN, PRIORITY_MAX, PRIORITY_DEFAULT = 1, 4, 2
MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX, MAX_ATTEMPTS_DEFAULT = 1, 1000, 25
NAME_MAX_LEN = 200  # kind and queue
#: Per-key concurrency (docs/guide/concurrency-keys.md): the bounds of a key's
#: max_in_flight, and the limit of a key whose job and queue name none.
MAX_IN_FLIGHT_MIN, MAX_IN_FLIGHT_MAX, MAX_IN_FLIGHT_DEFAULT = 1, 1_000_000, 1
#: A keyed claim walks at most this many keys (the next claim goes on from
#: where it stopped); a queue not configured for keys looks for keyed jobs at
#: most once per KEY_PROBE_INTERVAL, when its plain claim comes back short, and
#: goes back to plain claims after KEY_IDLE without claiming a keyed job.
KEY_WALK_MAX = 500
KEY_PROBE_INTERVAL = timedelta(seconds=1)
KEY_IDLE = timedelta(seconds=30)
#: `concurrency_keys` (operators' view of keys in flight) lists this many keys
#: unless asked for another number up to KEY_STATS_LIMIT_MAX, and counts each
#: key's waiting jobs up to KEY_WAITING_CAP (one index entry read per job).
KEY_STATS_LIMIT_DEFAULT, KEY_STATS_LIMIT_MAX = 50, 1000
KEY_WAITING_CAP = 10_000
TAGS_MAX = 20
#: The accepted ``run_at`` range (UTC, inclusive). The driver stores Python's
#: ``datetime.min``/``datetime.max`` as -infinity/+infinity, which no claim or
#: statistic can subtract from; a day's margin keeps every time zone inside.
RUN_AT_MIN = datetime(1, 1, 2, tzinfo=UTC)
RUN_AT_MAX = datetime(9999, 12, 30, tzinfo=UTC)
#: Deepest nesting of lists and objects accepted in args, metadata and payloads
#: (deeper JSON cannot be decoded back by Python's json without a RecursionError).
JSON_MAX_DEPTH = 128
#: Largest JSON accepted for args, metadata and callback payloads, in bytes
#: (``AWA_MAX_PAYLOAD_BYTES`` or `awa.set_max_payload_bytes` change it).
PAYLOAD_MAX_BYTES = 1024 * 1024
DEFAULT_QUEUE = "default"
#: scheduled, available, running, completed, retryable.
UNIQUE_STATES_DEFAULT = 0b0001_1111
UNIQUE_STATES_MAX = 0b1111_1111

STAGED_FOLLOW_UPS_MAX = 16
STAGED_FOLLOW_UPS_MAX_BYTES = 64 * 1024
OUTPUT_MAX_BYTES = 64 * 1024
#: Longest error text kept per attempt (characters): a handler's exception
#: message past this is cut, ending with a marker that says how long it was.
ERROR_TEXT_MAX = 16 * 1024
#: Longest tag (characters); at most TAGS_MAX of them.
TAG_MAX_LEN = 1024

# -- runtime defaults ----------------------------------------------------------
# A crashed worker's attempts are rescued within HEARTBEAT_STALENESS + RESCUE_INTERVAL
# (40 s; plus one leader election, 5 s, when the leader crashed too) and run again after
# the retry backoff of their attempt (2-2.5 s for a first attempt). The spec's 30/90/30 s
# meant up to two minutes; measured by tests/chaos (test_recovery_time_with_default_settings).
HEARTBEAT_INTERVAL = timedelta(seconds=10)
HEARTBEAT_STALENESS = timedelta(seconds=30)
RESCUE_INTERVAL = timedelta(seconds=10)
DEADLINE = timedelta(minutes=5)
#: Every statement of the runtime's own (claims, completions, heartbeats,
#: maintenance) gives up after this long, so a half-open connection (a NAT or
#: proxy that silently stopped forwarding) is dropped instead of hanging a worker.
RUNTIME_STATEMENT_TIMEOUT = timedelta(seconds=30)
#: A queue whose claims failed this many times in a row makes `health_check()`
#: (and ``/readyz``) report the worker unhealthy, naming the queue and the error.
CLAIM_FAILURES_UNHEALTHY = 3
#: The LISTEN connection is probed this often (and dropped when the probe times out).
LISTEN_PROBE_INTERVAL = timedelta(seconds=5)
#: The most jobs one claim takes (a queue's ``claim_batch_size`` by default).
#: A claim's fixed cost (its round trip, a dozen statements' set-up over the
#: ring's partitions, one WAL flush at commit) is about 0.65 ms of server CPU,
#: as much as 45 jobs' share of it: at 128 a claim averaged 79 jobs and a
#: one-worker drain of no-op jobs ran 1.36x slower than at 512 (two workers:
#: 1.34x, whose claims take turns through their commit). bench/run.py, issue 42.
CLAIM_BATCH_SIZE = 512
#: A busy queue (every slot but a few in use) waits this long for more slots to
#: free before claiming, so claims come in batches of at least a quarter of
#: the queue's slots instead of one or two jobs per round trip.
CLAIM_COALESCE = timedelta(milliseconds=1)
#: A queue whose handlers average at most this long claims ahead of its free
#: slots (how many: `CLAIM_AHEAD_WAIT`): the next claim's round trip overlaps
#: the running batch instead of following it. Slower handlers never claim
#: ahead (work would sit here that another worker could be running).
CLAIM_AHEAD_MAX_RUN = timedelta(milliseconds=5)
#: Jobs claimed ahead wait for a slot about this long at most: a queue claims
#: ahead only as many as its slots run in that time at its handlers' average
#: (a claimed job's deadline runs from its claim, and a crashed worker's claimed
#: jobs wait for rescue). 32 slots of 0.1 ms handlers: the whole batch; one
#: slot of 5 ms handlers: 20 jobs.
CLAIM_AHEAD_WAIT = timedelta(milliseconds=100)
#: The claim is planned once and reused (planning cost as much as running it),
#: but never for longer than this: a plan is only as good as the table size it
#: was made for, and one made on an empty table scans a big backlog whole.
CLAIM_PLAN_LIFETIME = timedelta(seconds=2)
#: How often the leader checks awa.jobs for dead tuples (and vacuums it past a threshold).
VACUUM_CHECK_INTERVAL = timedelta(seconds=5)
#: How often the leader moves the append-only lane's ring on and reclaims its
#: spent slots (docs/storage.md, "Rotation and reclamation"): 4 slots of 30 s
#: hold two minutes of history before a slot has to be spent to move on.
RING_ROTATE_INTERVAL = timedelta(seconds=30)
#: How often a worker process writes its outcome counts and pickup latencies
#: (one new awa.queue_throughput row per queue; rows are never updated, so a
#: held xmin horizon keeps nothing alive there, and fewer rows read faster).
THROUGHPUT_FLUSH_INTERVAL = timedelta(seconds=5)
#: How long making an hourly partition of awa.jobs_done waits for its lock
#: (every completion inserts there, and waits behind a lock request queued
#: behind a long reader); a partition not made in time is made next pass.
PARTITION_LOCK_TIMEOUT = timedelta(milliseconds=200)
#: How long a reclaim waits for a slot's table before trying again (a few
#: times a pass, then the next pass): the only pause the ring's upkeep can
#: cause claims and completions. The lock is asked for only once the table
#: looks spent (migration 0023), when what holds it is normally statements
#: already running (milliseconds); a reader holding it longer costs the hot
#: path at most this long per try.
RING_RECLAIM_LOCK_TIMEOUT = timedelta(milliseconds=50)
#: How long a registered callback waits (and a callback heartbeat extends it)
#: when no ``timeout_seconds`` is given. The SQL statements take the timeout
#: as a parameter; this is the one place the default is written.
CALLBACK_TIMEOUT = timedelta(seconds=3600)
CALLBACK_TIMEOUT_SECS = CALLBACK_TIMEOUT.total_seconds()
PRIORITY_AGING_INTERVAL = timedelta(seconds=60)
COMPLETED_RETENTION = timedelta(hours=24)
FAILED_RETENTION = timedelta(hours=72)
DLQ_RETENTION = timedelta(days=30)

# -- retry backoff ----------------------------------------------------------------
#: The longest a failed job waits before its next attempt.
BACKOFF_CAP = timedelta(hours=24)
#: The exponent of the backoff stops growing here (2**30 s is far past the cap).
BACKOFF_MAX_EXPONENT = 30
#: A retry waits up to this fraction longer than ``2**attempt`` seconds, at random,
#: so that jobs which failed together do not all retry at the same moment.
BACKOFF_JITTER = 0.25


def retry_delay(attempt: int, jitter: float) -> timedelta:
    """How long a job waits after failing attempt ``attempt`` before the next one:
    ``min(2**min(attempt, 30) * (1 + 0.25 * jitter), 24 h)`` seconds, ``jitter``
    uniform in [0, 1): about 2 s after the first attempt, 1,024 s after the
    tenth, the 24 h cap from the seventeenth on.

    The database computes it: every statement that schedules a retry (a failed
    or rescued attempt, an expired callback) calls the SQL function
    ``awa.retry_delay(attempt)`` of migration 0001, with ``random()`` as the
    jitter. This is the same formula, to read and to reason with;
    tests/test_states.py checks that the two agree. A handler's `RetryAfter`
    chooses its own delay instead.
    """
    seconds = 2.0 ** min(attempt, BACKOFF_MAX_EXPONENT) * (1 + BACKOFF_JITTER * jitter)
    return timedelta(seconds=min(seconds, BACKOFF_CAP.total_seconds()))


# -- awaitable results and producer backpressure ----------------------------------
#: `wait_for` checks its jobs this often when LISTEN is unavailable (behind a
#: transaction pooler, or while the LISTEN connection is down).
RESULT_POLL_INTERVAL = timedelta(milliseconds=500)
#: How long past its timeout a `wait_for` may spend in database calls (a row lock, a
#: pool with no free connection) before it raises `WaitTimeout` all the same.
RESULT_DB_GRACE = timedelta(seconds=1)
#: ...and this often while LISTEN works, as a safety net only: every finish of
#: a waited-on job sends a NOTIFY, and a reconnect re-checks every waiter.
RESULT_SAFETY_POLL = timedelta(seconds=5)
#: ``backpressure="signal"`` counts a queue's available jobs up to this many
#: (a depth of exactly this value means "at least"): the count reads one claim
#: index entry per job, so it is bounded whatever the backlog.
DEPTH_SIGNAL_CAP = 10_000
#: The largest ``Reject(limit)`` / ``target_depth``: a check reads up to that
#: many index entries (10-15 ms per 100,000: bench/results/results_backpressure.md).
DEPTH_LIMIT_MAX = 1_000_000

# -- job dependencies (docs/guide/workflows.md) -------------------------------
#: A child waiting for its parents is ``scheduled`` at this run_at (the latest
#: accepted one), so promotion never reaches it; its parents release it.
PARKED_RUN_AT = RUN_AT_MAX
#: What happens to a child whose parent failed or was cancelled.
PARENT_FAILURE_POLICIES = ("cancel", "run_anyway", "discard")
#: Most parents one job may wait for, and most jobs in one workflow.
DEPENDENCY_PARENTS_MAX = 10_000
WORKFLOW_JOBS_MAX = 10_000
#: Resolved dependency edges (kept for the workflow graph) are pruned after this.
DEPENDENCY_RETENTION = timedelta(hours=72)
#: Children the statement finishing a parent releases itself (migration 0019,
#: counted over its cascade); the workers' release service does the rest.
DEPENDENCY_RELEASE_INLINE = 1000
#: Children per transaction of the release service (its default chunk).
DEPENDENCY_RELEASE_CHUNK = 5000
#: How often each worker looks for parents whose children are left to release.
DEPENDENCY_RELEASE_INTERVAL = timedelta(milliseconds=250)
