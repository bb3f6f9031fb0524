"""Screen the alert policy's band, quiet hours and margin on one hourly run's validation stays (its test unread).

    python -m experiments.screen_alert_policy --run RUN_ID --mlruns STORE [--out docs/results]

For each setting of the grid, the threshold of highest Challenge utility of the policy's alarms is chosen on the
run's validation predictions (``garlic.evaluation.alerting.choose``), and the validation utility and per-alert
scores at it are listed (``alert-policy-screen.md`` and ``.csv`` with ``--out``): what the policy's defaults
(``garlic.metrics.alert_policy``) were chosen from.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import pandas as pd

from garlic.evaluation import alerting
from garlic.io.atomic import atomic_file
from garlic.tracking.queries import test_predictions

BANDS = (0.0, 0.1, 0.25)
QUIET_HOURS = (0.0, 6.0, 12.0, 24.0)
MARGINS = (0.25, 0.5, 1.0)


def screen(validation: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (a margin matters only with quiet hours: one row for quiet hours 0)."""
    rows = []
    for band, quiet, margin in itertools.product(BANDS, QUIET_HOURS, MARGINS):
        if quiet == 0 and margin != MARGINS[0]:
            continue
        choice = alerting.choose(validation, band=band, quiet_hours=quiet, margin=margin)
        rows.append(
            {
                "band": band,
                "quiet_hours": quiet,
                "margin": margin,
                "threshold": choice.policy.threshold,
                **choice.scores,
            }
        )
    return pd.DataFrame(rows)


TIE = 0.005  # validation utilities this close to the best count as tied


def chosen(table: pd.DataFrame) -> pd.Series:
    """Of the settings within ``TIE`` of the best validation utility, the one raising the fewest alerts: how the
    policy's defaults were chosen."""
    near = table[table["utility"] >= table["utility"].max() - TIE]
    return near.loc[near["alerts_per_100_days"].idxmin()]


def report(table: pd.DataFrame, run_id: str) -> str:
    pick = chosen(table)
    lines = [
        "# The alert policy's settings, screened on validation",
        "",
        f"Made by `python -m experiments.screen_alert_policy --run {run_id} --mlruns STORE --out docs/results`: "
        f"run {run_id}'s validation stays, its test unread. Each row: the policy's band, quiet hours and margin, "
        "the threshold of highest Challenge utility of its alarms, and at it the validation utility and the "
        f"per-alert scores (`docs/alerts.md`). {len(table)} settings: the margin matters only with quiet hours, so "
        f"one row each for quiet hours 0. Chosen (the policy's defaults): of the settings within {TIE} of the best "
        f"validation utility, the one raising the fewest alerts: band {pick.band:g}, quiet hours "
        f"{pick.quiet_hours:g}, margin {pick.margin:g}.",
        "",
        "| band | quiet hours | margin | threshold | utility | sensitivity | PPV | lead hours | alerts / 100 days |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        lines.append(
            f"| {row.band:g} | {row.quiet_hours:g} | {row.margin:g} | {row.threshold:.4g} | {row.utility:.3f} "
            f"| {row.sensitivity:.1%} | {row.ppv:.1%} | {row.lead_median:.0f} | "
            f"{row.alerts_per_100_days:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="an hourly run (its validation predictions)")
    parser.add_argument("--mlruns", type=Path, default=Path("mlruns"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    table = screen(test_predictions(args.mlruns, args.run, "validation"))
    print(table.to_string(index=False, float_format=lambda value: f"{value:.4g}"))
    if args.out is not None:
        with atomic_file(args.out / "alert-policy-screen.csv", mode="w", suffix=".csv") as handle:
            table.to_csv(handle, index=False, float_format="%.6g")
        with atomic_file(args.out / "alert-policy-screen.md", mode="w", suffix=".md") as handle:
            handle.write(report(table, args.run))


if __name__ == "__main__":
    main()
