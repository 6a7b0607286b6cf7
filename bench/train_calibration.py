"""The planner against the measured points of tests/fixtures/corpus/memory-dev.md (development half).

    .venv/bin/python bench/train_calibration.py [--smoke]

Prints the README's table: the predicted allocated peak of each fully specified point and its error, the capacity
points (the longest sequence that fits, an OOM), and the ACTIVATION_SCALE a least-squares fit on the peak points
gives (the planner's constant should be that value). Not a test: tests/unit/test_train_plan.py bounds the errors.
``--smoke`` (every bench takes it; tests/bench/test_bench_smoke.py runs it) is the whole run: it takes a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import statistics
from dataclasses import replace

from remediation.train import plan as planner
from remediation.train.calibration import capacity_rows, fit_scale, loo_rows, peak_rows
from remediation.train.plan import ACTIVATION_SCALE

UNDER = 0.05  # issue 23: a peak under-predicted by more than 5 % out of sample is a defect


def main() -> int:
    ap = argparse.ArgumentParser(description="the planner against the measured points (development half)")
    ap.add_argument("--smoke", action="store_true", help="the same run (it is already a second's work)")
    ap.parse_args()
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
    print("\nLeave-one-out (ACTIVATION_SCALE refitted without the point; signed, negative = under-predicted):\n")
    print("| point | scale without it | measured | planner | in-sample error | leave-one-out error |")
    print("|---|---|---|---|---|---|")
    rows = loo_rows()
    in_sample = {point.id: error for point, _, error in peak_rows()}
    for r in rows:
        print(f"| {r.point.id} | {r.scale} | {r.point.measured_bytes / 1e9:.2f} GB | {r.predicted / 1e9:.2f} GB "
              f"| {in_sample[r.point.id]:+.1%} | {r.error:+.1%} |")
    absolute = [abs(r.error) for r in rows]
    under = [f"{r.point.id} {r.error:+.1%}" for r in rows if r.error < -UNDER]
    print(f"\nleave-one-out: median absolute error {statistics.median(absolute):.1%}, worst {max(absolute):.1%}; "
          f"under-predicted by more than {UNDER:.0%}: {', '.join(under) or 'none'}")
    status = 1 if under else 0
    print("\nCapacity points at the listed longest length (not fitted: out of sample as they are): the planner's total "
          "against the GPU, an upper bound on the measured total, so a negative figure bounds the under-prediction:\n")
    print("| point | planner total / GPU at the listed length |")
    print("|---|---|")
    for point, _, _ in capacity_rows():
        if point.listed_seq is not None and point.input.capacity_bytes:
            result = planner.plan(replace(point.input.checked(), seq_len=point.listed_seq))
            print(f"| {point.id} | {result.peak_bytes / point.input.capacity_bytes - 1:+.1%} |")
    return status


if __name__ == "__main__":
    sys.exit(main())
