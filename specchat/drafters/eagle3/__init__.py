"""EAGLE-3: one draft layer over three of the target's layers' states, drafting on its own outputs (`drafter.py`), its
network and checkpoint loader (`model.py`), training-time test (`objective.py`) and `specchat train eagle3`
(`train.py`)."""
