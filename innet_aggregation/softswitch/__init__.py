"""Embedded software switch: runs a p4c-bm2-ss BMv2 JSON like simple_switch_grpc,
compiled to C (native backend) or to Python.

See softswitch/README.md.
"""
