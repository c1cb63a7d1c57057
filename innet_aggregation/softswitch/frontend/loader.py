"""The front half's entry: JSON text to a checked, described and lowered program."""

from __future__ import annotations

import json

from innet_aggregation.softswitch.frontend import validate
from innet_aggregation.softswitch.frontend.lower import lower
from innet_aggregation.softswitch.frontend.program import DROP_PORT, Program
from innet_aggregation.softswitch.frontend.validate import Unsupported


def load(text: str | bytes, drop_port: int = DROP_PORT) -> Program:
    """Parse and check a BMv2 JSON document; raises Unsupported or ValueError, each
    one line naming what was wrong (and where in the JSON, for the document)."""
    if type(drop_port) is not int or not 0 <= drop_port < validate.MAX_ID:
        raise ValueError(f"drop port {drop_port!r} is not an int in [0, 2^31)")
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"device config is not valid JSON: {exc}") from None
    try:
        program = Program(validate.document(doc), drop_port)
    except RecursionError:
        raise ValueError("device config is nested too deeply") from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:   # a gap in validate
        raise ValueError(f"malformed BMv2 JSON: {type(exc).__name__}: {exc}") from None
    try:
        program.ir = lower(program)   # refuses what neither backend runs, naming it
    except RecursionError:
        raise Unsupported("the program's controls are nested too deeply") from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:   # a gap in validate
        raise ValueError(f"malformed BMv2 JSON: {type(exc).__name__}: {exc}") from None
    return program


