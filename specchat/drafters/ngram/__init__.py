"""Prompt lookup (`drafter.py`), also in a table of the target's own answers (`answer_store.py`), which `specchat
train ngram` writes (`train.py`)."""
