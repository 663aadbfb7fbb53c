"""specchat: exact tree speculative decoding for long contexts."""

import time

__version__ = "0.1.0"
STARTED = time.perf_counter()  # when the process began running specchat: the chat's "ready in N s" counts from here
