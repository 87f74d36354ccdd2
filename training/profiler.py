"""`QuietProfiler`: the trainer's profiler when none is asked for, at no cost per step.

Lightning wraps every hook it calls (each callback's, at every step) in its profiler's
`profile()`; its default, `PassThroughProfiler`, measures nothing but still builds a generator
context for each. This one hands back one shared `nullcontext`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from lightning.pytorch.profilers import Profiler

_NOTHING = nullcontext()


class QuietProfiler(Profiler):
    """Profiles nothing, as `Trainer(profiler=None)` does, without a context object per hook."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass

    def profile(self, action_name: str) -> AbstractContextManager[None]:
        return _NOTHING
