"""The manager's state in SQLite (WAL): the jobs on the switch or on their way on
or off it, each with its configuration (its allocation), its ranks' lease tokens and
its state. A job's row is written before any switch write for it (INSTALLING), says
RUNNING once the switches hold it, REMOVING before its removal starts, and goes
only once the switches confirmed the removal. So a manager killed at any point
finds every id, slot, port and address it may have written in here: a restart keeps
the running jobs and takes the others off the switches. A restarted switch gets the
running jobs re-applied from it. Jobs still gathering ranks or waiting for room live
in memory only: their ranks register again.
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
    started REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'running'     -- installing, running or removing
);
CREATE TABLE IF NOT EXISTS ranks (
    job TEXT NOT NULL REFERENCES jobs(name) ON DELETE CASCADE,
    rank INTEGER NOT NULL,
    token TEXT NOT NULL,
    closed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, rank)
);
"""
INSTALLING, RUNNING, REMOVING = "installing", "running", "removing"


@dataclass
class StoredJob:
    name: str
    config: dict
    started: float
    tokens: dict[int, str]
    closed: set[int] = field(default_factory=set)
    state: str = RUNNING


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
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
            if "state" not in columns:      # a database of a manager before states
                self._db.execute("ALTER TABLE jobs ADD COLUMN state TEXT NOT NULL "
                                 "DEFAULT 'running'")

    def add_job(self, name: str, config: dict, tokens: dict[int, str],
                state: str = RUNNING) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO jobs (name, config, started, state) "
                             "VALUES (?, ?, ?, ?)",
                             (name, json.dumps(config), time.time(), state))
            self._db.executemany("INSERT INTO ranks (job, rank, token) VALUES (?, ?, ?)",
                                 [(name, rank, token) for rank, token in tokens.items()])

    def close_rank(self, name: str, rank: int) -> None:
        with self._lock:
            self._db.execute("UPDATE ranks SET closed = 1 WHERE job = ? AND rank = ?",
                             (name, rank))

    def set_state(self, name: str, state: str) -> None:
        with self._lock:
            self._db.execute("UPDATE jobs SET state = ? WHERE name = ?", (state, name))

    def delete_job(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM jobs WHERE name = ?", (name,))

    def jobs(self) -> list[StoredJob]:
        with self._lock:
            jobs = {name: StoredJob(name, json.loads(config), started, {}, state=state)
                    for name, config, started, state in self._db.execute(
                        "SELECT name, config, started, state FROM jobs ORDER BY started")}
            for job, rank, token, closed in self._db.execute(
                    "SELECT job, rank, token, closed FROM ranks"):
                jobs[job].tokens[rank] = token
                if closed:
                    jobs[job].closed.add(rank)
        return list(jobs.values())

    def close(self) -> None:
        with self._lock:
            self._db.close()
