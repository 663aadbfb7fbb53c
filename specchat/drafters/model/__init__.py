"""SpecExtend: a small standalone draft model (`model.py`: loaded, or a student of the target's first layers)
reading a working cache (`working_cache.py`) laid out by a cache policy, growing dynamic trees
(`dynamic_tree.py`; `drafter.py`), its training objective (`objective.py`) and `specchat train model-drafter`
(`train.py`)."""
