"""Pictures of a model and a run: attention maps, loss curves, and the HTML run report.

Drawn with matplotlib's Agg backend, so nothing here needs a display.
"""
