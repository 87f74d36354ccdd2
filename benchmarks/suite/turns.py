"""Two processes taking turns: each runs a few steps while the other waits, so that a machine
whose speed drifts within minutes slows both alike and their ratio holds.

The parent (`take_turns`) starts the commands with `$MINIGPT_TURNS` set, and hands out turns in
order through a pair of named pipes per process; a process (`Turns`) waits for its turn before
its first step, hands the turn on every `every` steps and at its last, and only then goes on to
whatever follows its steps (saving, reporting), so no one's ending overlaps another's turn.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

ENV = "MINIGPT_TURNS"
"""`<go pipe>:<done pipe>:<steps per turn>`, set by `take_turns` for each command."""


class Turns:
    """A process's side: `begin()` before the first step, `step_done()` after each."""

    def __init__(self, go: str, done: str, every: int) -> None:
        self.every = every
        self._go = open(go, "rb", buffering=0)  # noqa: SIM115 (kept open for the whole run)
        self._done = open(done, "wb", buffering=0)  # noqa: SIM115
        self._start = 0.0
        self._steps = 0
        self.turns: list[tuple[float, int]] = []
        """(seconds, steps) of each turn: from being handed the turn to the end of its last step."""

    @classmethod
    def from_env(cls) -> Turns | None:
        setting = os.environ.get(ENV)
        if not setting:
            return None
        go, done, every = setting.rsplit(":", 2)
        return cls(go, done, int(every))

    def begin(self) -> None:
        self._wait()

    def step_done(self, last: bool) -> None:
        self._steps += 1
        if self._steps % self.every and not last:
            return
        self.turns.append((time.perf_counter() - self._start, self._steps - sum(s for _, s in self.turns)))
        self._done.write(b"e" if last else b"x")
        self._wait()  # after the last: for the word that every process has taken its last turn

    def _wait(self) -> None:
        if not self._go.read(1):
            raise SystemExit("the process handing out turns has gone")
        self._start = time.perf_counter()


def per_step(turns: Sequence[Sequence[float]], skip: int) -> float:
    """Seconds a step over the turns after the first `skip` steps (whole turns left out)."""
    seconds = steps = taken = 0
    for turn_seconds, turn_steps in turns:
        taken += turn_steps
        if taken > skip:
            seconds, steps = seconds + turn_seconds, steps + turn_steps
    return seconds / steps


def _writer_once_read(path: Path, process: subprocess.Popen) -> object:
    """`path` opened for writing once `process` opens it to read (as it reaches its first step);
    a process that ends before that ends the benchmark."""
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as err:
            if err.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        if process.poll() is not None:
            raise SystemExit(f"error: {process.args[1]} exited {process.returncode} before its first step")
        time.sleep(0.05)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "wb", buffering=0)


def take_turns(commands: Sequence[list[str]], every: int, folder: Path, **run: object) -> list[int]:
    """Run `commands` at once, handing out turns of `every` steps in order; their exit codes."""
    pipes = []
    for i in range(len(commands)):
        go, done = folder / f"go{i}", folder / f"done{i}"
        os.mkfifo(go)
        os.mkfifo(done)
        pipes.append((go, done))
    env = dict(run.pop("env", None) or os.environ)
    processes = [
        subprocess.Popen(command, env={**env, ENV: f"{go}:{done}:{every}"}, **run)  # type: ignore[call-overload]
        for command, (go, done) in zip(commands, pipes, strict=True)
    ]
    ends: list[tuple[object, object]] = []
    try:
        for (go, done), process in zip(pipes, processes, strict=True):
            ends.append((_writer_once_read(go, process), open(done, "rb", buffering=0)))  # noqa: SIM115
        running = list(range(len(commands)))
        while running:
            for i in list(running):
                go_end, done_end = ends[i]
                try:
                    go_end.write(b"x")
                    word = done_end.read(1)
                except BrokenPipeError:
                    word = b""
                if word != b"x":  # its last turn (b"e"), or it ended (b"")
                    running.remove(i)
        for go_end, _ in ends:  # every process has taken its last turn: let them end
            try:
                go_end.write(b"x")
            except BrokenPipeError:
                pass
        return [p.wait() for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
        for go_end, done_end in ends:
            go_end.close()
            done_end.close()
