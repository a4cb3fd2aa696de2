"""The offline event buffer: a bounded FIFO of events in SQLite (the standard library's
``sqlite3``, WAL journal), kept until callgate has them.

One row per event, keyed by its place in the queue (``seq``); a one-row ``stats`` table kept
by triggers holds the count and the bytes, so appending and counting cost O(1) whatever the
buffer holds (the oldest rows are dropped, also O(1) each, when an append would pass
``max_bytes``). No other index is written per append: the deliverer removes what it sent by
``seq`` (``rows`` then ``remove``); an event buffered twice is sent twice, which callgate
answers as a duplicate (event IDs make delivery idempotent). SQLite's own file locking makes it
safe across processes sharing one directory; a lock makes one connection safe across threads.
WAL with ``synchronous=NORMAL`` survives a crash of the agent (not of the machine: the last
appends may then be lost, and re-sent events are harmless, event IDs make delivery idempotent).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger("callgate_sdk")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY,  -- max(seq) + 1 on insert: FIFO order among the rows kept
    body TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS stats (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    count INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO stats (id, count, bytes) VALUES (1, 0, 0);
CREATE TRIGGER IF NOT EXISTS events_added AFTER INSERT ON events BEGIN
    UPDATE stats SET count = count + 1, bytes = bytes + NEW.size WHERE id = 1;
END;
CREATE TRIGGER IF NOT EXISTS events_removed AFTER DELETE ON events BEGIN
    UPDATE stats SET count = count - 1, bytes = bytes - OLD.size WHERE id = 1;
END;
"""


class EventBuffer:
    """A bounded FIFO of events. With ``directory`` it is ``<directory>/events.sqlite3`` and
    survives restarts; without, it lives in memory (SQLite's ``:memory:``).

    ``max_bytes`` bounds the events' JSON text: when an append would pass it, the oldest
    events are dropped with a warning (``dropped`` counts them, for this object).
    """

    FILE_NAME = "events.sqlite3"

    def __init__(
        self, directory: str | os.PathLike | None = None, *, max_bytes: int = 10 * 1024 * 1024
    ):
        self.max_bytes = max_bytes
        self.dropped = 0
        self.path: Path | None = None
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.path = Path(directory) / self.FILE_NAME
        self._lock = threading.Lock()
        # autocommit mode: every transaction below is explicit (BEGIN IMMEDIATE takes the
        # write lock at once, so two processes never both read-then-write)
        self._db = sqlite3.connect(
            str(self.path) if self.path else ":memory:",
            timeout=30.0,
            isolation_level=None,
            check_same_thread=False,
        )
        with self._lock:
            if self.path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def append(self, events: Iterable[dict]) -> None:
        """Add events at the end, dropping the oldest ones if the buffer would exceed
        ``max_bytes``."""
        rows = []
        for event in events:
            body = json.dumps(event, separators=(",", ":"), default=str)
            rows.append((body, len(body.encode())))
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT INTO events (body, size) VALUES (?, ?)", rows)
                dropped = self._trim()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if dropped:
            self.dropped += dropped
            logger.warning(
                "callgate event buffer full (%d bytes): dropped the %d oldest event(s)",
                self.max_bytes,
                dropped,
            )

    def _trim(self) -> int:
        """Delete the oldest events until the bytes fit (inside the caller's transaction)."""
        (excess,) = self._db.execute("SELECT bytes - ? FROM stats", (self.max_bytes,)).fetchone()
        dropped = 0
        while excess > 0:
            row = self._db.execute("SELECT seq, size FROM events ORDER BY seq LIMIT 1").fetchone()
            if row is None:
                break
            self._db.execute("DELETE FROM events WHERE seq = ?", (row[0],))
            excess -= row[1]
            dropped += 1
        return dropped

    def rows(self, n: int) -> list[tuple[int, dict]]:
        """The ``n`` oldest events with their ``seq``, oldest first (not removed)."""
        with self._lock:
            found = self._db.execute(
                "SELECT seq, body FROM events ORDER BY seq LIMIT ?", (max(0, n),)
            ).fetchall()
        return [(seq, json.loads(body)) for seq, body in found]

    def peek(self, n: int) -> list[dict]:
        """The ``n`` oldest events, oldest first (not removed)."""
        return [event for _, event in self.rows(n)]

    def remove(self, seqs: Iterable[int]) -> None:
        """Remove the events at these ``seq`` (from ``rows``: delivered, or rejected for good)."""
        keys = [(seq,) for seq in set(seqs)]
        if not keys:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM events WHERE seq = ?", keys)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count FROM stats").fetchone()[0]

    def size_bytes(self) -> int:
        """The buffered events' JSON text, in bytes."""
        with self._lock:
            return self._db.execute("SELECT bytes FROM stats").fetchone()[0]
