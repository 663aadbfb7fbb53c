"""specchat: exact tree speculative decoding for long contexts."""

__version__ = "0.1.0"
