"""The native backend: the lowered program printed as C (``printer``), compiled
against ``runtime.c`` and loaded with ctypes (``loader``)."""
