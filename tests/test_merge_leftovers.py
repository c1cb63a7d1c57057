"""No tracked file keeps a merge's conflict markers: one once sat in the README for a
session, where nothing that runs would have read it."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_no_tracked_file_has_conflict_markers():
    found = subprocess.run(
        ["git", "grep", "-n", "-I", "-E", r"^(<<<<<<< |>>>>>>> |=======$)"],
        cwd=REPO, capture_output=True, text=True)
    if found.returncode == 128:     # not a git checkout (an sdist): nothing to check
        return
    assert found.stdout == "", "conflict markers:\n" + found.stdout
