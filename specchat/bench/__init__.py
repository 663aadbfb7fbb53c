"""`specchat bench`: measurements in one process on one machine, reported as tables and JSON, never asserted.

- `compare.py`: every method (our engine with each drafter, our autoregressive decoding, transformers'
  `generate`, llama.cpp) on the same prompts, interleaved; one row per method and prompt set;
- `runs.py`: one greedy generation by one method, with its decode time (prefill excluded);
- `prompts.py`: the built-in prompt sets and JSONL prompt files; `plot.py`: the rows drawn with matplotlib;
- `llamacpp.py`: llama.cpp on the same GGUF, through llama-cpp-python (an optional extra);
- `context.py` (`bench context`): autoregressive time per token as the context grows;
- `attention.py` (`bench attention`): one attention call of a tree verification, computed each way there is;
- `verify_cost.py` (`bench verify-cost`): decode vs tree-verification forward of Llama-3.1-8B's shapes;
- `draft_cost.py` (`bench draft`): a LongSpec draft's cost per proposal and its memory, against the target's
  forwards, as the context grows;
- `synthetic.py`: what the synthetic benches share (option checks, random trees).

Generation benchmarks read the engine's own decode clock. The synthetic ones time calls with the engine's one
timer (`specchat.engine.timing`) and run verification forwards through its one helper
(`specchat.engine.verify_forward`), as the engine's calibration does. The engine never imports this package.
"""
