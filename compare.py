"""Compare finished runs: a table (markdown + CSV) and plots (PNG).

    python compare.py multirun/2026-11-21/10-00-00          # every run of a sweep
    python compare.py runs/a runs/b --out report/ --target-loss 2.0

Writes report.md, report.csv, val_loss_vs_step.png, val_loss_vs_time.png and
throughput.png into --out (default: a 'report' folder in the first path), and
prints the table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis.plots import plot_throughput, plot_val_loss
from analysis.report import COLUMNS, build_rows, check_comparable, default_target, markdown_table
from analysis.runs import find_runs
from analysis.tables import write_csv, write_text
from cli import user_errors


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="run directories or multirun directories")
    p.add_argument("--out", help="output folder (default: <first path>/report)")
    p.add_argument("--target-loss", type=float, help="for 'time to target' (default: the loss every run reached)")
    p.add_argument("--force", action="store_true", help="compare runs of different data or token budgets")
    p.add_argument("--wandb", action="store_true",
                   help="also log the table and plots as a wandb run (job_type=compare) in the sweep's group; "
                        "offline without an API key, like training")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    if args.target_loss is not None and not args.target_loss > 0:
        raise ValueError(f"--target-loss {args.target_loss} must be a positive loss (nats per token)")
    if args.out and Path(args.out).is_file():
        raise ValueError(f"--out {args.out} is a file; give a folder for the report")
    runs = find_runs(args.paths)
    check_comparable(runs, force=args.force)
    target = args.target_loss if args.target_loss is not None else default_target(runs)
    rows, rule = build_rows(runs, target)
    out = Path(args.out) if args.out else Path(args.paths[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)

    fields = [k for k, _ in COLUMNS] + ["final_train_loss_se"]
    write_csv(out / "report.csv", ["run", *fields], [[str(run.path), *(row[k] for k in fields)]
                                                     for run, row in zip(runs, rows)])  # fmt: skip
    finished = [(run, row) for run, row in zip(runs, rows) if run.failure is None]
    plots = []
    if finished:
        plots = [
            plot_val_loss([run for run, _ in finished], out, "step"),
            plot_val_loss([run for run, _ in finished], out, "time"),
            plot_throughput([run for run, _ in finished], [row for _, row in finished], out),
        ]

    info = (finished[0][0] if finished else runs[0]).info
    table = markdown_table(rows)
    header = (
        f"{len(runs)} runs on {info.get('device_name', '?')} ({info.get('dtype', '?')}); model "
        f"{info['model']['name']} ({info.get('params', 0):,} parameters), data {info['data']['name']}, "
        f"{runs[0].token_budget:,} tokens per run.\n"
        f"Target loss for 'time to target': {target if target is None else f'{target:.4f}'}.\n"
        f"Flagged: {rule}.\n"
    )
    figures = "\n".join(f"![{p.stem}]({p.name})" for p in plots)
    excluded = ("Speed and time columns exclude compilation (its own 'compile s' column) and count each "
                "warm-up step (the first 10% of steps, at most 20) as a steady-state step.\n")
    write_text(out / "report.md", f"# Comparison\n\n{header}{excluded}\n{table}\n\n{figures}\n")
    if args.wandb:
        from analysis.wandb_report import log_report

        logger = {**info.get("logger", {}), "group": info.get("group")}
        log_report("compare", f"report-{info.get('group') or out.parent.name}", out,
                   {"report": (["run", *fields], [[str(run.path), *(row[k] for k in fields)]
                                                  for run, row in zip(runs, rows)])}, plots, logger)  # fmt: skip
    print(header)
    print(table)
    print(f"\nwritten to {out}/ (report.md, report.csv, {', '.join(p.name for p in plots)})")
    return out


if __name__ == "__main__":
    with user_errors("python compare.py <sweep dir | run dirs ...> [--out DIR] [--target-loss X] [--force]"):
        main()
