"""In-network gradient aggregation: the P4 program (p4src), its controller and job
manager (switch_ctl), the host side and torch integration (worker), the embedded
software switch (softswitch) and the testbed, under one name so that nothing of
ours lands in site-packages as ``worker`` or ``testbed``."""

from pathlib import Path

#: What a child process needs on PYTHONPATH to import this package (a checkout's root,
#: or site-packages), so that subprocesses run the same code as their parent.
IMPORT_ROOT = Path(__file__).resolve().parents[1]
