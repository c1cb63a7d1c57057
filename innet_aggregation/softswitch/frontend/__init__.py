"""The half both backends share: the JSON checked once (``validate``), described
(``program``) and lowered to one intermediate form (``ir``, ``lower``) that each
backend only prints."""

from innet_aggregation.softswitch.frontend import validate
from innet_aggregation.softswitch.frontend.program import (DROP_PORT, INSTANCE_E2E_CLONE, INSTANCE_I2E_CLONE,
                                                           INSTANCE_NORMAL, INSTANCE_RECIRC,
                                                           INSTANCE_REPLICATION, INSTANCE_RESUBMIT,
                                                           ActionSpec, CounterSpec, Field, Header, Program,
                                                           RegisterSpec, TableSpec, hexstr, mask)
from innet_aggregation.softswitch.frontend.loader import load
from innet_aggregation.softswitch.frontend.validate import Unsupported

__all__ = ["validate", "DROP_PORT", "INSTANCE_E2E_CLONE", "INSTANCE_I2E_CLONE", "INSTANCE_NORMAL",
           "INSTANCE_RECIRC", "INSTANCE_REPLICATION", "INSTANCE_RESUBMIT", "ActionSpec",
           "CounterSpec", "Field", "Header", "Program", "RegisterSpec", "TableSpec", "Unsupported",
           "hexstr", "load", "mask"]
