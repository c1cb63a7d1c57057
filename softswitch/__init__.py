"""Embedded Python software switch: runs a p4c-bm2-ss BMv2 JSON like simple_switch_grpc.

See softswitch/README.md.
"""
