"""Tasks made from the plays, with answers that can be checked: instruction data for fine-tuning
and held-out questions for evaluate.py. Two kinds, four choices each:

- "Who speaks these lines in <play>?": the opening lines of a speech, four speakers of the play.
- "Which line comes next in <play>?": one or two lines of a speech, its next line among three
  other lines of the play.

What the design keeps true, and the drafts that lost, are in docs/results/play-questions.md:
split by play (the six plays of `TEST_PLAYS` give the test file alone); scored by log-likelihood
among four choices (chance 25%); nothing outside the quoted lines beats chance (the answer drawn
among the choices, no name a prefix of another, the lines' look and length telling nothing); one
text for base and fine-tuned models; every question within small.yaml's context. Deterministic:
the files are a function of the cached corpus and the seed.

- `plays.py`: each play found in the corpus by its opening speech, and its speeches.
- `make.py`: the questions, their splits and the files.
"""
