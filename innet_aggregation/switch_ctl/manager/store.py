"""The manager's state in SQLite (WAL): the jobs installed on the switch, each with
its configuration and its ranks' lease tokens. A restarted manager reads it back and
keeps those jobs; a restarted switch gets them re-applied from it. Jobs still
gathering ranks or waiting for room live in memory only: their ranks register again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    name TEXT PRIMARY KEY,
    config TEXT NOT NULL,          -- switch_ctl.config's dict of the job (JSON)
    started REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ranks (
    job TEXT NOT NULL REFERENCES jobs(name) ON DELETE CASCADE,
    rank INTEGER NOT NULL,
    token TEXT NOT NULL,
    closed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, rank)
);
"""


@dataclass
class StoredJob:
    name: str
    config: dict
    started: float
    tokens: dict[int, str]
    closed: set[int] = field(default_factory=set)


class Store:
    """One connection, used under its own lock from the manager's threads."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)

    def add_job(self, name: str, config: dict, tokens: dict[int, str]) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO jobs (name, config, started) VALUES (?, ?, ?)",
                             (name, json.dumps(config), time.time()))
            self._db.executemany("INSERT INTO ranks (job, rank, token) VALUES (?, ?, ?)",
                                 [(name, rank, token) for rank, token in tokens.items()])

    def close_rank(self, name: str, rank: int) -> None:
        with self._lock:
            self._db.execute("UPDATE ranks SET closed = 1 WHERE job = ? AND rank = ?",
                             (name, rank))

    def delete_job(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM jobs WHERE name = ?", (name,))

    def jobs(self) -> list[StoredJob]:
        with self._lock:
            jobs = {name: StoredJob(name, json.loads(config), started, {})
                    for name, config, started in self._db.execute(
                        "SELECT name, config, started FROM jobs ORDER BY started")}
            for job, rank, token, closed in self._db.execute(
                    "SELECT job, rank, token, closed FROM ranks"):
                jobs[job].tokens[rank] = token
                if closed:
                    jobs[job].closed.add(rank)
        return list(jobs.values())

    def close(self) -> None:
        with self._lock:
            self._db.close()
