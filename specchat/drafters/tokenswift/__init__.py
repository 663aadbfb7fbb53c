"""TokenSwift: heads on the target's last state (`model.py`), drafting with n-gram reuse (`ngram_table.py`) over
a partial KV cache (`partial_kv.py`; `drafter.py`), their training objective (`objective.py`) and `specchat train
tokenswift` (`train.py`)."""
