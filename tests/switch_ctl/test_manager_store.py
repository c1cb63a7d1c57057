"""The manager's SQLite store: job states, and a database of a manager from before
states (no state column) read as running jobs."""

from __future__ import annotations

import sqlite3

from innet_aggregation.switch_ctl.manager.store import (INSTALLING, REMOVING, RUNNING,
                                                        Store)

OLD_SCHEMA = """
CREATE TABLE jobs (name TEXT PRIMARY KEY, config TEXT NOT NULL, started REAL NOT NULL);
CREATE TABLE ranks (job TEXT NOT NULL REFERENCES jobs(name) ON DELETE CASCADE,
    rank INTEGER NOT NULL, token TEXT NOT NULL, closed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, rank));
INSERT INTO jobs VALUES ('old', '{"job": {"id": 3}}', 1.0);
INSERT INTO ranks VALUES ('old', 0, 'aa', 1), ('old', 1, 'bb', 0);
"""


def test_states_and_a_database_from_before_states(tmp_path):
    path = tmp_path / "manager.db"
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
    store = Store(path)
    try:
        (old,) = store.jobs()
        assert (old.name, old.state, old.tokens, old.closed) == (
            "old", RUNNING, {0: "aa", 1: "bb"}, {0})
        store.add_job("new", {"job": {"id": 4}}, {0: "cc"}, state=INSTALLING)
        assert {j.name: j.state for j in store.jobs()} == {"old": RUNNING, "new": INSTALLING}
        store.set_state("new", REMOVING)
        assert {j.name: j.state for j in store.jobs()} == {"old": RUNNING, "new": REMOVING}
        store.delete_job("new")
        assert [j.name for j in store.jobs()] == ["old"]
    finally:
        store.close()
    with sqlite3.connect(path) as db:       # the ranks went with their job
        assert db.execute("SELECT job, rank FROM ranks ORDER BY rank").fetchall() == [
            ("old", 0), ("old", 1)]
