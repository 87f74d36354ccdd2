"""A run's loss curves and HTML report: `python report.py --run runs/small`.

Writes `loss_curves.png` and `report.html` into the run folder; `--help` lists every option.
"""

from __future__ import annotations

from minigpt.cli.report import report_main


def main(args: list[str] | None = None) -> int:
    return report_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
