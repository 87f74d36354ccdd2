"""Everything a run does beside its step, as Lightning callbacks (and the checkpoint plugin).

Every run has them unless its config says otherwise (cli/train_defaults.py):

- `checkpoints.py`: atomic checkpoints, one line where one cannot be written, `last.ckpt`.
- `guards.py`: stop on a signal with a checkpoint saved, or before non-finite values land.
- `throughput.py`: tokens per second, tokens seen and MFU.
- `console.py`: the run summary and the step progress bar.
- `dashboard.py`: samples and attention maps at each validation, the report at the end, drawn
  in forked children (`background.py`).
- `validate_at_end.py`: the last step validates, whatever the interval.
- `averaging.py`: `EMAWeights`, a moving average of the weights (small.yaml).
- `lm_eval_tasks.py`: `EvaluateTasks`, lm-evaluation-harness tasks every few validations.
"""
