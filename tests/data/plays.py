"""A stand-in for the built-in corpus: the 38 plays' openings, each followed by made-up speeches."""

from __future__ import annotations

from minigpt.data.questions.plays import PLAYS

SPEAKERS = {
    "ANNA": 40,
    "BERT": 20,
    "CLARA": 12,
    "DORA": 12,
    "EDGAR": 12,
    "KING": 12,
    "KING HENRY": 12,  # KING is a prefix of it: never both among one question's choices
    "ALL": 12,  # several characters at once: never a choice
    "WALK ON": 3,  # too few speeches: never a choice
}
"""Speeches of each speaker in every play: ANNA speaks most, as a play's busiest speaker does."""


def speech_line(title: str, speaker: str, number: int) -> str:
    """A line that names its play and speaker, so a test can tell where a quoted line comes from."""
    return f"{speaker.title()} says line {number} in {title}"


def speech_lines(title: str, speaker: str, number: int) -> list[str]:
    """A speech's lines, each naming its play, of lengths that vary with the speaker and number
    alike; the second starts lowercase, as a line that carries on a sentence does."""
    return [
        speech_line(title, speaker, number),
        f"and {speaker.lower()} says {number} in {title}",
        f"So, {speaker.title()} ends {number} in {title}",  # as long as the second
    ]


def synthetic_corpus() -> str:
    """The plays back to back, as the built-in corpus holds them: each its opening speech, then
    every speaker's speeches in turn, some too short to quote."""
    plays = []
    for title, opening in PLAYS:
        speeches = [opening]
        for number in range(max(SPEAKERS.values())):
            for speaker, count in SPEAKERS.items():
                if number < count and number % 5:
                    lines = "".join(line + "\n" for line in speech_lines(title, speaker, number))
                    speeches.append(f"{speaker}:\n{lines}")
                elif number < count:
                    speeches.append(f"{speaker}:\nMy lord.\n")
        plays.append("\n".join(speeches) + "\n")
    return "".join(plays)
