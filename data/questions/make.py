"""The questions: "who speaks these lines?" and "which line comes next?", four choices each,
split by play into train, validation and test files (see the package's docstring)."""

from __future__ import annotations

import bisect
import itertools
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from minigpt.common import safe_write

from ..errors import DataError
from ..shakespeare import shakespeare_path
from .plays import (
    MAX_PASSAGE_CHARS,
    MIN_PASSAGE_CHARS,
    TEST_PLAYS,
    Speech,
    passage,
    play_speeches,
    split_plays,
)

SPLITS = ("train", "validation", "test")
"""The files written, ``<split>.jsonl``."""
GROUP_SPEAKERS = frozenset({"ALL", "BOTH", "OTHERS", "SEVERAL", "LORDS", "CITIZENS", "SERVANTS"})
"""Speaker names that stand for several characters at once: never a choice."""
MIN_SPEECHES = 10
"""Speeches a speaker needs in a play to be a choice (drops walk-ons and the corpus's stray names)."""
TEST_PER_PLAY = 150
"""Questions of each kind asked of each test play (900 of each: a standard error of about 1.5
points of accuracy)."""
VALIDATION_PER_PLAY = 16
"""Questions of each kind and training play kept out of the train file, for the validation file
(512 of each kind)."""
KINDS = ("speaker", "next_line")
"""The kinds of question, each row's ``kind``: who speaks these lines, which line comes next."""
CONTEXT_LINES = 2
"""Lines of its speech a next-line question quotes (one when the answer is the speech's second)."""
MIN_LINE_CHARS = 20
"""A shorter line ("My lord?") follows almost anything: never the answer of a next-line question."""
LENGTH_SLACK = 0.2
"""A distractor's length is within this fraction of the answer's."""
NEAR_LINES = 10
"""Distractors come from further than this many lines from the answer: never its neighbours."""
ASKED_FRACTION = 0.5
"""The share of a play's lines fit to be a next-line answer that are asked for, drawn uniformly."""
DRAWS = 64
"""Lines drawn at most to find each distractor; a question short of one is not asked."""


def prompt(title: str, quoted: str, choices: Sequence[str]) -> str:
    """The user's message: the question, the lines, the choices, and the cue for the answer."""
    return f"Who speaks these lines in {title}?\n\n{quoted}\n\nChoices: {', '.join(choices)}\nAnswer:"


def play_questions(title: str, speeches: Sequence[Speech], seed: int) -> list[dict[str, Any]]:
    """Questions on the play's speeches, each speech asked about once, until fewer than four speakers
    have a speech left to ask about.

    Each question draws four speakers, in proportion to the speeches they have left, then the
    answer among the four with equal chance, then a speech of the answer's. Given its choices,
    every one is as likely to be the answer, so nothing about the speakers alone (who speaks
    most, who is named in the title) beats chance: only the lines do.

    Each row is an instruction row (``instruction``, ``output``) that :mod:`.instructions` reads,
    with the ``choices``, the answer's index among them (``label``) and the ``play``.
    """
    counts = Counter(s.speaker for s in speeches)
    left: dict[str, list[str]] = {}  # speaker -> the passages of theirs still to ask about
    for speech in speeches:
        quoted = passage(speech)
        if quoted is not None and _eligible(speech.speaker, counts[speech.speaker]):
            left.setdefault(speech.speaker, []).append(quoted)
    rng = random.Random(f"{seed}:{title}")  # a str seeds the same in every process
    for lines in left.values():
        rng.shuffle(lines)
    rows = []
    while True:
        names = sorted(name for name, lines in left.items() if lines)
        choices = _weighted_sample(names, [len(left[n]) for n in names], 4, rng)
        if len(choices) < 4:
            return rows
        answer = rng.choice(choices)
        rng.shuffle(choices)
        rows.append(
            {
                "instruction": prompt(title, left[answer].pop(), choices),
                "output": answer,
                "choices": choices,
                "label": choices.index(answer),
                "play": title,
                "kind": "speaker",
            }
        )


def next_line_prompt(title: str, quoted: str) -> str:
    """The user's message of a next-line question: the question, the lines, the cue for the answer."""
    return f"Which line comes next in {title}?\n\n{quoted}\n\nAnswer:"


def next_line_questions(title: str, speeches: Sequence[Speech], seed: int) -> list[dict[str, Any]]:
    """Which line comes next? Questions on :data:`ASKED_FRACTION` of the play's lines that continue
    a speech, drawn uniformly: the line is the answer, the :data:`CONTEXT_LINES` of its speech
    before it are quoted, and three other lines of the play are set beside it.

    Answers and distractors are drawn from the same lines, so nothing that marks a speech's first
    line tells them apart. A distractor's length is within :data:`LENGTH_SLACK` of the
    answer's, and how many are shorter is drawn uniformly, so the answer is equally likely to be
    the shortest, second, third or longest choice; the answer's place among the four is drawn
    uniformly too. None lies within :data:`NEAR_LINES` of the answer, none is quoted, and no choice
    is another's prefix (nor equal to it). Rows are :func:`play_questions`' with ``kind``
    ``"next_line"``.
    """
    lines = [line for speech in speeches for line in speech.lines]  # the play's, in order
    starts = [0]
    for speech in speeches:
        starts.append(starts[-1] + len(speech.lines))
    firsts = set(starts)
    pool = sorted((len(line), at) for at, line in enumerate(lines) if at not in firsts and _spoken(line))
    rng = random.Random(f"{seed}:{title}:next_line")
    askable = [
        (first, at)
        for first, end in itertools.pairwise(starts)
        for at in range(first + 1, end)
        if _askable(lines, first, at)
    ]
    rows = []
    for first, at in sorted(rng.sample(askable, round(len(askable) * ASKED_FRACTION))):
        context = lines[max(first, at - CONTEXT_LINES) : at]
        choices = _distractors(lines, pool, at, context, rng)
        if choices is None:
            continue
        label = rng.randrange(4)
        choices.insert(label, lines[at])
        rows.append(
            {
                "instruction": next_line_prompt(title, "\n".join(context)),
                "output": lines[at],
                "choices": choices,
                "label": label,
                "play": title,
                "kind": "next_line",
            }
        )
    return rows


def _spoken(line: str) -> bool:
    return line != line.upper()  # the corpus holds a few speakers' names as lines


def _askable(lines: list[str], first: int, at: int) -> bool:
    """Whether ``lines[at]``, of the speech starting at ``first``, can be asked for: long enough,
    after quoted lines neither too short nor too long (:data:`MIN_PASSAGE_CHARS`,
    :data:`MAX_PASSAGE_CHARS`, as for who speaks)."""
    quoted = "\n".join(lines[max(first, at - CONTEXT_LINES) : at])
    fits = MIN_PASSAGE_CHARS <= len(quoted) <= MAX_PASSAGE_CHARS
    return fits and len(lines[at]) >= MIN_LINE_CHARS and _spoken(lines[at])


def _distractors(
    lines: list[str], pool: list[tuple[int, int]], at: int, context: list[str], rng: random.Random
) -> list[str] | None:
    """Three lines of ``pool`` (``(length, index)``, sorted) to set beside ``lines[at]``, in random
    order (see :func:`next_line_questions`); None where one is not found in :data:`DRAWS` draws."""
    answer = lines[at]
    shorter = rng.randrange(4)
    bounds = [(round(len(answer) * (1 - LENGTH_SLACK)), len(answer) - 1)] * shorter
    bounds += [(len(answer) + 1, round(len(answer) * (1 + LENGTH_SLACK)))] * (3 - shorter)
    chosen: list[str] = []
    for shortest, longest in bounds:
        low = bisect.bisect_left(pool, (shortest, -1))
        high = bisect.bisect_right(pool, (longest, len(lines)))
        for _ in range(DRAWS if high > low else 0):
            i = pool[rng.randrange(low, high)][1]
            line = lines[i]
            clash = any(line.startswith(c) or c.startswith(line) for c in (answer, *chosen))
            if abs(i - at) > NEAR_LINES and line not in context and not clash:
                chosen.append(line)
                break
        else:
            return None
    rng.shuffle(chosen)  # else the choices' order would tell which were drawn shorter
    return chosen


def _eligible(speaker: str, speeches: int) -> bool:
    return speeches >= MIN_SPEECHES and speaker not in GROUP_SPEAKERS and "," not in speaker


def _weighted_sample(names: list[str], weights: list[int], k: int, rng: random.Random) -> list[str]:
    """``k`` of ``names`` drawn without replacement, each draw in proportion to ``weights``, none a
    prefix of another (fewer where too few are left)."""
    names, weights, drawn = list(names), list(weights), []
    while names and len(drawn) < k:
        (name,) = rng.choices(names, weights)
        drawn.append(name)
        keep = [i for i, n in enumerate(names) if not (n.startswith(name) or name.startswith(n))]
        names, weights = [names[i] for i in keep], [weights[i] for i in keep]
    return drawn


def question_splits(text: str, seed: int = 1337) -> dict[str, list[dict[str, Any]]]:
    """Split -> rows of every kind: the test plays' questions (:data:`TEST_PER_PLAY` of each kind
    and play, drawn by the seed) for test; the other plays' for train, but
    :data:`VALIDATION_PER_PLAY` of each kind and play for validation. Test and validation hold one
    kind after the other, in :data:`KINDS`' order; train holds them mixed.

    Raises:
        DataError: ``text`` is not the built-in corpus (see :func:`split_plays`).
    """
    makers = {"speaker": play_questions, "next_line": next_line_questions}
    splits: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLITS}
    plays = {title: play_speeches(play) for title, play in split_plays(text).items()}
    for kind in KINDS:
        for title, speeches in plays.items():
            rows = makers[kind](title, speeches, seed)
            held_out = min(len(rows), TEST_PER_PLAY if title in TEST_PLAYS else VALIDATION_PER_PLAY)
            draw = f"{seed}:{title}:split" if kind == "speaker" else f"{seed}:{title}:{kind}:split"
            drawn = set(random.Random(draw).sample(range(len(rows)), held_out))
            held = [row for i, row in enumerate(rows) if i in drawn]
            if title in TEST_PLAYS:
                splits["test"] += held
            else:
                splits["validation"] += held
                splits["train"] += [row for i, row in enumerate(rows) if i not in drawn]
    random.Random(f"{seed}:train order").shuffle(splits["train"])  # fine-tuning reads plays mixed
    return splits


def write_splits(
    out: Path, splits: Mapping[str, list[dict[str, Any]]], force: bool = False
) -> dict[str, Path]:
    """Write each split to ``out/<split>.jsonl``, one row a line; the paths.

    Raises:
        DataError: A file exists and ``force`` is not set; WriteError: a full disk, a folder not theirs.
    """
    paths = {name: out / f"{name}.jsonl" for name in splits}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not force:
        raise DataError(f"{existing[0]} already exists; pass --force to replace it, or --out another folder")
    for name, path in paths.items():
        with safe_write(path) as tmp:
            tmp.write_text("".join(json.dumps(row) + "\n" for row in splits[name]), encoding="utf-8")
    return paths


def corpus_splits(seed: int = 1337) -> dict[str, list[dict[str, Any]]]:
    """:func:`question_splits` of the built-in corpus (fetched on first use, then cached)."""
    return question_splits(shakespeare_path().read_text(encoding="utf-8"), seed)
