"""Work done beside the training loop, in a forked process: what a validation shows (a sample, the
attention maps) takes seconds that would otherwise stop training.

A fork gives the child a snapshot of the parent as it is when the validation ends (the weights it
validated, the tokenizer, everything imported) without copying or pickling anything, and the
parent trains on while the child works at a lower priority. The child touches no accelerator:
CUDA cannot be used in a forked process, so what it needs from the device is copied to the host
before the fork. Where the platform cannot fork (Windows), the work runs in the loop as before.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
import warnings
from collections.abc import Callable
from typing import Any

from minigpt.common import UsageError

NICENESS = 10
"""How much lower the child's priority is: on a busy CPU, training goes first."""


class Job:
    """`target(*args)` started now, in a forked child where the platform can fork, else run here.

    `done()` says, without waiting, whether the result is in; `result()` waits for it and returns
    it, or raises RuntimeError with the child's traceback when the work failed; a UsageError (one
    line for the user, such as a WriteError for a full disk) is raised again as it is.
    """

    def __init__(self, target: Callable[..., Any], *args: Any, background: bool = True) -> None:
        self._process: Any = None
        self._value: Any = None
        context = _fork_context() if background else None
        if context is None:
            self._value = target(*args)
            return
        self._receive, send = context.Pipe(duplex=False)
        with warnings.catch_warnings():  # Python 3.12+ warns of forking a threaded process: the
            # child computes on the host with one thread, writes files and takes no lock of theirs
            warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
            self._process = context.Process(target=_child, args=(send, target, args), daemon=True)
            self._process.start()
        send.close()  # the child holds the only sending end: its exit ends the pipe

    def done(self) -> bool:
        return self._process is None or self._receive.poll()

    def result(self) -> Any:
        if self._process is None:
            return self._value
        try:
            ok, value = self._receive.recv()
        except EOFError:  # the child died without a word (killed, or out of memory)
            ok, value = False, "it ended without a result"
        self._process.join()
        self._receive.close()
        self._process = None
        if not ok:
            if isinstance(value, UsageError):
                raise value
            raise RuntimeError(f"background work failed: {value}")
        self._value = value
        return value


def _fork_context() -> Any:
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def _child(send: Any, target: Callable[..., Any], args: tuple[Any, ...]) -> None:
    import torch

    os.nice(NICENESS)
    # One thread: the parent's OpenMP pool did not survive the fork, and the cores are training's.
    torch.set_num_threads(1)
    try:
        send.send((True, target(*args)))
    except BaseException as error:  # noqa: BLE001 - whatever went wrong, the parent raises it
        send.send((False, error if isinstance(error, UsageError) else traceback.format_exc()))
    finally:
        send.close()
