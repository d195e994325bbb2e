"""Compare runs: a table (markdown + CSV) and plots (PNG), at any moment of a sweep.

    python compare.py multirun/2026-11-21/10-00-00          # every run of a sweep
    python compare.py runs/a runs/b --out report/ --target-loss 2.0
    python compare.py multirun/2026-11-21/10-00-00 --watch  # again every minute while runs are still going

Writes report.md, report.csv, val_loss_vs_step.png, val_loss_vs_time.png and
throughput.png into --out (default: a 'report' folder in the first path), and
prints the table. Runs still going, stopped, killed or failed are reported as far
as they got, and their state says which.
"""

from __future__ import annotations

from common.startup import guard_start_up, start_up_over

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import argparse
import time
from collections import Counter
from pathlib import Path

from analysis.lengths import length_curves, lengths_table, plot_loss_vs_length, plot_sweep_by_position
from analysis.plots import plot_throughput, plot_val_loss
from analysis.report import (
    build_rows,
    check_comparable,
    csv_columns,
    default_target,
    markdown_table,
    parameter_counts,
    profile_table,
    speed_caution_note,
    speed_cautions,
    token_budgets,
)
from analysis.runs import find_runs
from analysis.tables import write_csv, write_text
from cli import OneLineErrorParser, user_errors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="run directories or multirun directories")
    p.add_argument("--out", help="output folder (default: <first path>/report)")
    p.add_argument("--target-loss", type=float, help="for 'time to target' (default: the loss every run reached)")
    p.add_argument("--force", action="store_true", help="compare runs of different data or token budgets")
    p.add_argument("--watch", type=float, nargs="?", const=60.0, metavar="SECONDS",
                   help="write the report again every SECONDS (default 60) until no run is still going")
    p.add_argument("--wandb", action="store_true",
                   help="also log the table and plots as a wandb run (job_type=compare) in the sweep's group; "
                        "offline without an API key, like training")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.target_loss is not None and not args.target_loss > 0:
        raise ValueError(f"--target-loss {args.target_loss} must be a positive loss (nats per token)")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ValueError(f"--out {args.out} is a file (or a named pipe); give a folder for the report")
    if args.watch is not None and not args.watch > 0:
        raise ValueError(f"--watch {args.watch} must be a positive number of seconds")
    start_up_over()  # the report begins
    while True:
        out, still_going = report(args)
        if args.watch is None or not still_going:
            return out
        print(f"\n{still_going} run(s) still going: the next report in {args.watch:g} s (Ctrl-C stops watching)\n")
        time.sleep(args.watch)


def report(args: argparse.Namespace) -> tuple[Path, int]:
    """Write the report once; returns its folder and how many runs are still going."""
    runs = find_runs(args.paths)
    check_comparable(runs, force=args.force)
    target = args.target_loss if args.target_loss is not None else default_target(runs)
    rows, rule = build_rows(runs, target)
    out = Path(args.out) if args.out else Path(args.paths[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)

    fields = csv_columns(rows) + ["final_train_loss_se"]
    write_csv(out / "report.csv", ["run", *fields], [[str(run.path), *(row[k] for k in fields)]
                                                     for run, row in zip(runs, rows)])  # fmt: skip
    trained = [(run, row) for run, row in zip(runs, rows) if run.failure is None]
    plots = []
    if trained:
        plots = [
            plot_val_loss([run for run, _ in trained], out, "step"),
            plot_val_loss([run for run, _ in trained], out, "time",
                          speed_cautions([run for run, _ in trained], [row for _, row in trained])),
            plot_throughput([run for run, _ in trained], [row for _, row in trained], out),
        ]

    curves = length_curves(runs)  # runs evaluated past their trained length (evaluate.py lengths=[...])
    lengths = lengths_table(curves) if curves else ""
    if curves:
        plots += [plot_loss_vs_length(curves, out), plot_sweep_by_position(curves, out)]
    past = ("\n## Past the trained length\n\nEach run's newest `evaluate.py lengths=[...]` result for each way of "
            "reading it (protocol, past context, rotary scaling): the mean validation loss at each evaluation "
            "length (tokens) over a variant's seeds.\n\n"
            f"{lengths}\n") if lengths else ""  # fmt: skip
    info = (trained[0][0] if trained else runs[0]).info
    table = markdown_table(rows)
    shared = speed_caution_note(rows)
    states = Counter(run.state for run in runs)
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    incomplete = ("Runs not finished are reported as far as they got; the loss flags and the default target "
                  "use the finished runs.\n") if set(states) - {"finished"} else ""  # fmt: skip
    header = (
        f"{len(runs)} runs ({counts}) on {info.get('device_name', '?')} ({info.get('dtype', '?')}); model "
        f"{info['model'].get('name', '?')} ({parameter_counts([run for run, _ in trained] or runs)}), data "
        f"{info.get('data', {}).get('name', '?')}, {token_budgets(runs)}.\n"
        f"Target loss for 'time to target': {target if target is None else f'{target:.4f}'}.\n"
        f"A run is flagged (last column) for {rule}.\n{incomplete}"
    )
    figures = "\n".join(f"![{p.stem}]({p.name})" for p in plots)
    excluded = ("Speed and time columns exclude compilation (its own 'compile s' column) and count each "
                "warm-up step (the first 10% of steps, at most 20) as a steady-state step.\n")
    profiles = profile_table(runs)
    where = ("\n## Where a step's time goes (trainer.profile=true)\n\nMilliseconds per step by kind, from the "
             f"profiled steps of each run (training/profiling.py says how ops and kernels are classified).\n\n"
             f"{profiles}\n") if profiles else ""  # fmt: skip
    below = f"\n{shared}" if shared else ""
    write_text(out / "report.md", f"# Comparison\n\n{header}{excluded}\n{table}\n{below}\n{figures}\n{past}{where}")
    if args.wandb:
        from analysis.wandb_report import log_report

        logger = {**info.get("logger", {}), "group": info.get("group")}
        log_report("compare", f"report-{info.get('group') or out.parent.name}", out,
                   {"report": (["run", *fields], [[str(run.path), *(row[k] for k in fields)]
                                                  for run, row in zip(runs, rows)])}, plots, logger)  # fmt: skip
    print(header)
    print(table)
    if shared:
        print(f"\n{shared}", end="")
    if lengths:
        print(f"\npast the trained length (loss at each evaluation length):\n{lengths}")
    if profiles:
        print(f"\nwhere a step's time goes (ms per step):\n{profiles}")
    print(f"\nwritten to {out}/ (report.md, report.csv, {', '.join(p.name for p in plots)})")
    return out, states["running"]


if __name__ == "__main__":
    with user_errors("python compare.py <sweep dir | run dirs ...> [--out DIR] [--target-loss X] [--force] [--watch]"):
        try:
            main()
        except KeyboardInterrupt:  # Ctrl-C while watching: the last report stays
            pass
