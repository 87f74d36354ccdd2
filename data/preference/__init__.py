"""Preference tuning's data (DPO): pairs of a preferred and a rejected answer to one prompt.

- `pairs.py`: reading rows (prompt, chosen, rejected as text or messages; play questions).
- `examples.py`: encoding each pair through the chat template, scored on its answers alone.
- `datamodule.py`: `PreferenceDataModule`, which `minigpt.data` exports.
"""
