"""What several test modules of this folder, and others, share."""

from __future__ import annotations

TRICKY = "Hello, wörld! 你好 🙂🎉\n\n\tTabs  and   spaces   \r\nend's we'll 1234567 <|endoftext|> x  \n"


CORPUS = "".join(
    f"{name}:\nNow is the winter of our discontent, made glorious summer by this sun of York {i}.\n\n"
    for i, name in enumerate(["GLOUCESTER", "CLARENCE", "BRAKENBURY", "HASTINGS"] * 40)
)
