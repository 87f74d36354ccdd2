"""What several test modules of this folder, and others, share."""

from __future__ import annotations

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n" * 3
