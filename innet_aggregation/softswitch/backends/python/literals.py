"""How the Python printer writes a number or a name into generated code: a number
through ``validate.num`` (an int in range, or refused), a name as an identifier of
``[A-Za-z0-9_]`` only. Shared by printer.py and packet.py."""

from __future__ import annotations

import keyword
import re

from innet_aggregation.softswitch.frontend.validate import MAX_BITS, MAX_HEADER_BITS, MAX_ID, num

BIG = 1 << (MAX_BITS + 1)                # bounds every constant and mask of a program
MAX_BYTES = MAX_HEADER_BITS // 8 + 1


def lit(value: int) -> str:
    return num(value, -BIG, BIG)


def id_lit(value: int) -> str:
    return num(value, 0, MAX_ID)


def ident(text: str) -> str:
    out = re.sub(r"\W", "_", text)
    return out if out and not out[0].isdigit() and not keyword.iskeyword(out) else f"x{out}"
