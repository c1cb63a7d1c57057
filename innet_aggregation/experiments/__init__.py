"""The experiments that run on the testbed, one file each (demo, chaos, baseline,
scaling, loss, straggler, sharing), over a shared measuring core: timed calls and the
links' rate (calls.py), the bytes each path puts on the wire and the time they take
there (link_model.py), medians with bootstrap intervals (stats.py), JSON records
(record.py), CSV and off-screen PNG (output.py), progress and time left
(progress.py), and the training experiments' models (models.py)."""
