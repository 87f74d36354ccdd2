"""`report.py`: the loss curves and the HTML report of a run, from its folder alone (no wandb)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .command import USER_ERRORS, options_parser, parse_options, report


@dataclass(frozen=True)
class ReportOptions:
    """Which run to report on."""

    run: str
    """The run folder (trainer.default_root_dir), holding csv/version_*/metrics.csv. The curves and
    the report are written into it as loss_curves.png and report.html."""


def report_main(args: Sequence[str] | None = None) -> int:
    """Parse the command line, write the curves and the report, print their paths. Returns the exit code."""
    parser = options_parser(
        "report.py",
        "Draw a run's loss curves and write its self-contained HTML report into the run folder.",
        ReportOptions,
    )
    try:
        (opts,) = parse_options(parser, args, ReportOptions)
        from minigpt.viz.report import write_run_report  # matplotlib: not for --help or a refusal

        curves, html = write_run_report(Path(opts.run))
    except USER_ERRORS as err:
        return report(err)
    print(curves)
    print(html)
    return 0
