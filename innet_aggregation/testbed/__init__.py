"""The fabric a person builds a topology from: hosts in namespaces or Mininet, links
shaped (links.py), switch processes (targets.py, p4switch.py), TLS for
P4Runtime, and the program each host runs (agents.py drives train.py). Nothing here
measures or judges; the experiments that do live in ``innet_aggregation.experiments``.
"""
