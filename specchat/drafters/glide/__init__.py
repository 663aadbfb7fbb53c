"""GLIDE + CAPE: a draft layer attending to the target's KV cache (`drafter.py`), its network (`model.py`), its
training objective (`objective.py`) and `specchat train glide` (`train.py`)."""
