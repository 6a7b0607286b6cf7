"""The planner against the measured points of tests/fixtures/corpus/memory-dev.md (development half).

    .venv/bin/python bench/train_calibration.py

Prints the README's table: the predicted allocated peak of each fully specified point and its error, the capacity
points (the longest sequence that fits, an OOM), and the ACTIVATION_SCALE a least-squares fit on the peak points
gives (the planner's constant should be that value). Not a test: tests/unit/test_train_plan.py bounds the errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remediation.train.calibration import capacity_rows, fit_scale, peak_rows
from remediation.train.plan import ACTIVATION_SCALE


def main() -> int:
    print("| point | job | measured | planner | error |")
    print("|---|---|---|---|---|")
    errors = []
    for point, predicted, error in peak_rows():
        errors.append(abs(error))
        print(f"| {point.id} | {point.what} | {point.measured_bytes / 1e9:.2f} GB | {predicted / 1e9:.2f} GB "
              f"| {error:+.1%} |")
    print(f"\nmean absolute error {sum(errors) / len(errors):.1%}, worst {max(errors):.1%}\n")
    print("| point | constraint | planner agrees | longest sequence the planner fits |")
    print("|---|---|---|---|")
    for point, agrees, longest in capacity_rows():
        listed = f"{longest:,} (listed {point.listed_seq:,})" if point.listed_seq else "-"
        print(f"| {point.id} | {point.what} | {'yes' if agrees else 'NO'} | {listed} |")
    print(f"\nACTIVATION_SCALE {ACTIVATION_SCALE}; least-squares fit on the peak points: {fit_scale()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
