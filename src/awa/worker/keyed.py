"""Keyed claims: per-key concurrency for one queue's dispatcher.

A job inserted with ``concurrency_key`` runs only in a free slot of its key
(see ``attempt_claim_keyed`` in ``db/sql/concurrency.sql`` and
docs/guide/concurrency-keys.md). The plain claim (``attempt_claim``) leaves
keyed jobs alone, so a queue that never sees one pays nothing for the
feature. A dispatcher uses the keyed claim, which also takes unkeyed jobs,
while its queue is keyed: always when the queue is configured with
``key_max_in_flight``, otherwise from the moment a probe finds keyed jobs
until none has been claimed for `KEY_IDLE`. Probes run only when a plain
claim comes back short (the queue is not saturated with unkeyed work), and at
most once per `KEY_PROBE_INTERVAL`.

Two claims racing for the last free slot of a key can pick the same slot
number (the second statement's snapshot predates the first's commit); the
unique index refuses the second, which is rolled back and simply claims again
(`RACE_RETRIES` times, then leaves it to the next loop). That is the
mechanism working, not a failure, so it is neither logged as one nor counted
in the queue's claim failures.

Where the ring is in use (migration 0020), a keyed queue's unkeyed jobs may be
ring jobs, which the keyed statements (awa.jobs only) cannot see: the claim
then also takes unkeyed jobs through awa.claim (``attempt_claim_keyed_ring``),
for what the keyed statements leave of the batch, and, when they fill it,
probes whether ring jobs wait (``ring_unkeyed_waiting``). While ring jobs wait,
the claims take turns at going first (awa.claim, then the keyed statements, or
the other way round), so neither kind waits behind a backlog of the other.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import asyncpg

from awa.core import states
from awa.db.lanes import Db, Lanes
from awa.db.queries import Queries

log = logging.getLogger("awa.dispatcher")
PROBE_SECONDS = states.KEY_PROBE_INTERVAL.total_seconds()
IDLE_SECONDS = states.KEY_IDLE.total_seconds()
RACE_RETRIES = 3


class KeyedClaims:
    """Whether one queue claims with keys, and where its walk over the keys stands."""

    def __init__(self, q: Queries, configured: bool, lanes: Lanes | None = None) -> None:
        self._q = q
        #: Whether the ring is in use (its unkeyed jobs are claimed through awa.claim).
        self.lanes = lanes if lanes is not None else Lanes(q)
        #: Ring jobs wait beyond what the last claim took (it was full, or a probe found some).
        self.ring_waiting = False
        self._ring_went_first = False  #: the last claim took ring jobs first (turns)
        self.configured = configured
        self._keyed_until = 0.0  #: monotonic time until which the queue counts as keyed
        self._next_probe = 0.0
        self.cursor = ""  #: the key the last walk ended on ('' = from the first)
        self.capped = False  #: the last walk stopped at KEY_WALK_MAX keys
        #: the last claim found unkeyed jobs: claim them with attempt_claim_keyed_chunk.
        #: False at first, so attempt_claim_keyed_only is planned while the worker
        #: waits for work, as the plain claim is: a generic plan made just after a
        #: bulk insert, before any VACUUM or ANALYZE has seen it, may sort a scan of
        #: every available job instead of reading the keyed claim index in order.
        self.mixed = False
        self.races = 0  #: claims refused by the slot index (and claimed again)

    @property
    def active(self) -> bool:
        """Claim with keys (the queue is configured for them or recently had some)."""
        return self.configured or time.monotonic() < self._keyed_until

    def probe_due(self) -> bool:
        """A short plain claim may look for keyed jobs now (rate-limited)."""
        now = time.monotonic()
        if now < self._next_probe:
            return False
        self._next_probe = now + PROBE_SECONDS
        return True

    async def claim(self, db: Db, queue: str, want: int, deadline: float,
                    aging: float) -> list[Any]:
        """Claim up to ``want`` jobs of ``queue``, keyed or not: `claim_batches`' rows
        in one list."""
        batches = await self.claim_batches(db, queue, want, deadline, aging)
        return [row for batch in batches for row in batch]

    async def claim_batches(self, db: Db, queue: str, want: int, deadline: float,
                            aging: float) -> list[list[Any]]:
        """Claim up to ``want`` jobs of ``queue``, keyed or not; one list of rows per
        statement that claimed (each for one keyed `ClaimDecoder`: its columns differ
        from the others'). Where the ring is in use, its unkeyed jobs too (see the
        module's docstring): each statement is its own transaction, so rows one
        claimed stay claimed whatever a later one does."""
        ring = await self.lanes.in_use(db)
        ring_first = ring and self.ring_waiting and not self._ring_went_first
        self._ring_went_first = ring_first
        self.capped = False
        batches: list[list[Any]] = []
        try:
            await self._claim_lanes(db, queue, want, deadline, aging, ring, ring_first, batches)
        except Exception:
            if not any(batches):
                raise
            # The jobs claimed by an earlier statement are this loop's: hand them over.
            log.debug("keyed claim of %r failed after claiming; next loop", queue,
                      exc_info=True)
            self.capped = True
        if any(r["concurrency_key"] is not None for batch in batches for r in batch):
            self._keyed_until = time.monotonic() + IDLE_SECONDS
        return [batch for batch in batches if batch]

    async def _claim_lanes(self, db: Db, queue: str, want: int, deadline: float,
                           aging: float, ring: bool, ring_first: bool,
                           batches: list[list[Any]]) -> None:
        """The statements of one claim, in turn; each one's rows go to ``batches``."""
        ring_found = False
        if ring_first:
            rows = await self._ring(db, queue, want, deadline, aging)
            ring_found = bool(rows)
            batches.append(rows)
            want -= len(rows)
        if want > 0:
            rows = await self._keyed(db, queue, want, deadline, aging)
            batches.append(rows)
            want -= len(rows)
        if ring and not ring_first:
            if want > 0:
                rows = await self._ring(db, queue, want, deadline, aging)
                ring_found = bool(rows)
                batches.append(rows)
            else:  # the keyed statements filled the batch: do ring jobs wait?
                (row,) = await db.fetch(self._q["ring_unkeyed_waiting"], queue)
                self.ring_waiting = ring_found = bool(row["waiting"])
        self.mixed = self.mixed or ring_found

    async def _ring(self, db: Db, queue: str, want: int, deadline: float,
                    aging: float) -> list[Any]:
        """Unkeyed jobs of both lanes through awa.claim; whether more wait after them."""
        rows = list(await db.fetch(self._q["attempt_claim_keyed_ring"], queue, want,
                                   deadline, aging))
        self.ring_waiting = len(rows) == want
        return rows

    async def _keyed(self, db: Db, queue: str, want: int, deadline: float,
                     aging: float) -> list[Any]:
        """Claim up to ``want`` jobs of ``queue`` with the keyed statements (awa.jobs:
        keyed jobs, and unkeyed ones of the mutable lane); rows for a keyed
        `ClaimDecoder` (the claimed columns, then the key, its limit and the slot).

        First the small statement (one range scan of the next keys), without
        its scans for unkeyed jobs while the last claim found none
        (``attempt_claim_keyed_only``); then, only when it claimed nothing, or
        its keys could not fill the claim (some at their limit), or it found
        unkeyed jobs it did not look for, the walk key by key from where it
        stopped (which takes unkeyed jobs too), for the rest. Each is its own
        transaction: rows the first claimed stay claimed whatever the second
        does."""
        first = "attempt_claim_keyed_chunk" if self.mixed else "attempt_claim_keyed_only"
        rows = await self._attempt(db, first, queue, want, deadline, aging, self.cursor)
        if rows is None:
            return []
        if rows:
            last = rows[-1]
            self.cursor, walk, plain = last["cursor"], last["walk"], last["plain"]
            walk = walk or (plain and not self.mixed)
            self.mixed = plain
        else:  # nothing claimed: every key in the range at its limit, or nothing there
            walk = True
        claimed = list(rows)
        if walk and len(claimed) < want:
            try:
                more = await self._attempt(db, "attempt_claim_keyed", queue,
                                           want - len(claimed), deadline, aging, self.cursor,
                                           states.KEY_WALK_MAX)
            except Exception:  # the jobs claimed above are this loop's: hand them over
                log.debug("keyed walk of %r failed; next loop", queue, exc_info=True)
                self.capped = True
                more = None
            if more is not None:
                last = more[-1]
                self.cursor, self.capped = last["cursor"], last["capped"]
                more = [r for r in more if r["id"] is not None]  # none claimed: the walk's row
                self.mixed = self.mixed or any(r["concurrency_key"] is None for r in more)
                claimed += more
        return claimed

    async def _attempt(self, db: Db, statement: str, *args: Any) -> list[Any] | None:
        """Run a keyed claim statement, again when the slot index refuses it (a
        lost race); None after `RACE_RETRIES` such refusals."""
        for _ in range(RACE_RETRIES + 1):
            try:
                return await db.fetch(self._q[statement], *args)
            except asyncpg.UniqueViolationError:
                self.races += 1
        log.debug("keyed claim of %r lost %d slot races; next loop", args[0], RACE_RETRIES + 1)
        self.capped = True  # claim again straight away
        return None
