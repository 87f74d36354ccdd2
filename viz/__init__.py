"""Pictures of a model and a run: attention maps, loss curves, and the HTML run report.

Drawn without a display: the attention maps straight into pixels with Pillow, the rest with
matplotlib's Agg backend.
"""
