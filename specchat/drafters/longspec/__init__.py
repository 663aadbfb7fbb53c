"""LongSpec: one draft layer reading the target's KV cache (`drafter.py`), its network and checkpoint loader
(`model.py`), its training objective (`objective.py`) and `specchat train longspec` (`train.py`)."""
