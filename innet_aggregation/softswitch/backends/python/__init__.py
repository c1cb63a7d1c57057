"""The Python backend: the lowered program printed as Python (``printer``), its
helpers (``runtime``) and its tables, registers and PRE (``pipeline``)."""
