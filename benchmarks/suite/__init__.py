"""The benchmarks' library: the sections of `benchmarks/bench.py`, the code they share, and the code
every benchmark script shares (`configs`, `runs`), so that no script imports another.

One module per section (`matmul`, `train`, `alloc`, `bound`, `compile`, `lightning`, `generate`,
`data`), each with a `run(state)` that measures and writes its part of the report; `bench.py`
lists them in run order. The shared modules:

- `settings`: the run's frozen settings and the results sections hand on to later ones
- `stats`: clocks, interleaving order, medians and paired ratios, the machine-load meter
- `report`: the markdown report and number formatting
- `shapes`: the benchmark shapes, built from `configs/small.yaml` and `configs/char.yaml`
- `peer`: the reference implementation (`llms-from-scratch`), loaded once if installed
- `contestants`: one training step of ours or the peer, as a spec and as a built step
- `entries`: a contestant's timed blocks and the interleaved rounds that run them
- `worker`: the subprocess that runs contestants under its own allocator setting

and for the scripts:

- `configs`: configs read and laid over each other, dotted settings, the recipe's named variants
- `runs`: a training step timed in this process, a `train.py` run in its own, scoring windows
"""
