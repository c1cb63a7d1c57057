"""Topologies, switch processes and experiments."""
