"""The P4 program and, in protocol.py, its packet format and constants for Python."""
