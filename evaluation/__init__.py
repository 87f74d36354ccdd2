"""How good is a model: bits per byte and perplexity on any text (`text.py`), and the tasks of
lm-evaluation-harness through our `LM` (`harness.py`, `tasks.py`; the `eval` extra), with results
as a table and a JSON file (`results.py`). Imports no Lightning; lm-eval only when tasks are run."""
