"""The models the training experiments run (demo.py, straggler.py): an MLP's widths on
the digits (testbed/model.py builds it on each host) and the settings a run takes
unless told otherwise."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """An MLP on digits and the settings its demo runs with unless told otherwise."""
    hidden: tuple[int, ...]
    epochs: int
    lr: float
    bw: float               # link rate, Mbit/s
    accuracy: float | None  # test accuracy whose time to reach is measured

    def name(self) -> str:
        return "-".join(str(w) for w in (64, *self.hidden, 10)) + " MLP"


MODELS = {
    "small": Model(hidden=(32,), epochs=5, lr=0.01, bw=20.0, accuracy=None),
    # Adam at 1e-3 takes digits past 95 % in about 30 steps of 4 x 32 samples. At
    # 100 Mbit/s a step's 4.5 MB keep the links busy for 0.4 s through the switch
    # (0.6 s for gloo's ring) and the switch needs 46 k packets/s: 4 workers and
    # the switch on 2 busy cores keep that pace; at 200 Mbit/s they often do not.
    "large": Model(hidden=(1024, 1024), epochs=8, lr=0.001, bw=100.0, accuracy=0.95),
}
