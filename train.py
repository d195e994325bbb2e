"""Train a GPT: ``python train.py [group=option ...] [key=value ...]``.

    python train.py                                   # nano GPT on the embedded corpus, CPU, minutes
    python train.py attention=wrapper kernel=manual
    python train.py -m attention=wrapper,separate_qkv,fused_qkv kernel=manual,sdpa
    torchrun --standalone --nproc_per_node=8 train.py experiment=gpt2_small

``python train.py --help`` lists the config groups and every option.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import signal
import sys
import tempfile
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from cli import refuse_renamed_options, user_errors
from training import slurm
from training.config import TrainConfig  # noqa: F401  (registers the config schema with Hydra)
from training.continuation import STOP_AT_STEP, continue_command
from training.distributed import from_environment
from training.loop import RunFailed, plan_variants, train

RENAMED = {
    "attention.layout": "attention",
    "attention.kernel": "kernel",
    "model.layout": "attention",
}


def _quiet_non_main_ranks() -> None:
    """Under torchrun (or srun) only rank 0 writes: the other ranks' Hydra keeps no output directory or log."""
    if not from_environment().is_main:
        sys.argv += [
            f"hydra.run.dir={tempfile.gettempdir()}",
            "hydra.output_subdir=null",
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ]


def swept_keys(hydra_cfg) -> list[str]:
    """The keys a multirun varies: its sweeper's params and the command line's comma lists."""
    keys = list(hydra_cfg.sweeper.get("params") or {})
    for arg in sys.argv[1:]:
        key, sep, value = arg.partition("=")
        if sep and "," in value and not key.startswith("hydra") and key not in keys:
            keys.append(key.lstrip("+~"))
    return keys


def sweep_run_name(cfg: DictConfig, hydra_cfg) -> str | None:
    """``<attention>-<kernel>-<model>`` plus this job's values of the other swept keys (``-optim.lr=0.001``)."""
    job = dict(o.split("=", 1) for o in hydra_cfg.overrides.task if "=" in o)
    extra = [f"{k}={job[k]}" for k in swept_keys(hydra_cfg) if k in job and k not in NAMED_BY_DEFAULT]
    if not extra:
        return None
    return f"{cfg.model.attention}-{cfg.model.kernel}-{cfg.model.name}-" + "-".join(extra)


NAMED_BY_DEFAULT = ("attention", "kernel", "model", "model.attention", "model.kernel")


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # The only place that reads Hydra's state: train(cfg) gets the run directory, group and name as settings.
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if not multirun and hydra_cfg.sweeper.get("params"):
        if cfg.trainer.plan:
            return plan_every_variant(hydra_cfg)
        sys.exit(f"error: this config defines a sweep over {', '.join(hydra_cfg.sweeper.params)}; run it with -m "
                 f"(python train.py -m {' '.join(sys.argv[1:])}), or pick single values without the experiment")
    if cfg.trainer.run_dir is None:
        cfg.trainer.run_dir = hydra_cfg.runtime.output_dir
    if multirun and cfg.logger.group is None:
        sweep_dir = os.path.normpath(hydra_cfg.sweep.dir)
        cfg.logger.group = f"sweep-{os.path.basename(os.path.dirname(sweep_dir))}_{os.path.basename(sweep_dir)}"
    if multirun and cfg.logger.name is None:
        cfg.logger.name = sweep_run_name(cfg, hydra_cfg)
    try:
        with errors_for_the_launcher():
            with user_errors("python train.py [group=option ...] [key=value ...]; python train.py --help lists them"):
                summary = train(cfg)
    except RunFailed as err:
        if hydra_cfg.mode != RunMode.MULTIRUN:
            raise
        # One variant failing (e.g. out of memory) must not end the sweep: it is recorded, the rest go on.
        print(f"[train] job {hydra_cfg.job.num} failed: {err}", file=sys.stderr, flush=True)
        return None
    if summary.get("requeued"):  # no result: the launcher waits for the rerun, which continues the run
        raise SystemExit(0)
    if summary.get("stopped_by") and not slurm.in_slurm_job():
        stop_here(summary, hydra_cfg, multirun)
    return summary.get("val_loss")  # what a Hydra sweeper would optimise


def stop_here(summary: dict, hydra_cfg, multirun: bool) -> None:
    """A signal stopped the run: no later job of a sweep starts; say how to continue; exit 128 + signal.
    trainer.stop_at_step stopped it: say how to continue; a sweep goes on."""
    by_signal = summary["stopped_by"] != STOP_AT_STEP
    if from_environment().is_main:
        sweep_dir = os.path.abspath(hydra_cfg.sweep.dir) if multirun else None
        command = continue_command(sys.argv[1:], sweep_dir, os.path.abspath(hydra_cfg.runtime.output_dir),
                                   summary["stopped_by"])  # fmt: skip
        what = ("the sweep: finished jobs are skipped, this one continues from its last.pt, the rest start"
                if multirun else "the run from its last.pt, in the same directory")  # fmt: skip
        if not by_signal:
            what = "the sweep once it has ended (each job from its last.pt)" if multirun else what
            print(f"[train] stopped at step {summary['step']} (trainer.stop_at_step). Continue {what}:\n  {command}",
                  file=sys.stderr, flush=True)  # fmt: skip
            return
        print(f"[train] stopped by {summary['stopped_by']} at step {summary['step']}"
              f"{'; no later job of the sweep was started' if multirun else ''}. Continue {what}:\n  {command}",
              file=sys.stderr, flush=True)  # fmt: skip
    if by_signal:
        raise SystemExit(128 + signal.Signals[summary["stopped_by"]].value)


@contextlib.contextmanager
def errors_for_the_launcher():
    """In a job of Hydra's submitit launcher a user error must end as an error the launcher records:
    a bare exit leaves no result, and without SLURM accounting the sweep would wait for one forever."""
    try:
        yield
    except SystemExit as exit_:
        if os.environ.get("SUBMITIT_EXECUTOR") and exit_.code not in (None, 0):
            from training.job_errors import JobUserError  # the launcher prints it as the one line it is

            raise JobUserError(str(exit_.code)) from None
        raise


def plan_every_variant(hydra_cfg) -> None:
    """``trainer.plan=true`` on a sweep preset without -m: the plans of the sweep's variants."""
    from hydra import compose

    params = {key: str(values).split(",") for key, values in hydra_cfg.sweeper.params.items()}
    base = [o for o in hydra_cfg.overrides.task if o.partition("=")[0] not in params]
    configs = {}
    for values in itertools.product(*params.values()):
        variant = [f"{k}={v}" for k, v in zip(params, values)]
        configs[" ".join(variant)] = OmegaConf.to_object(compose(config_name="train", overrides=base + variant))
    print(f"python train.py -m {' '.join(sys.argv[1:])} would run {plan_variants(configs)}", flush=True)


def _check_launcher_installed() -> None:
    """hydra/launcher=submitit_* needs the plugin (the cluster extra); say so instead of a deep traceback."""
    launcher = next((a.partition("=")[2] for a in sys.argv[1:] if a.startswith("hydra/launcher=")), "")
    try:
        missing = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None
    except ModuleNotFoundError:  # no Hydra plugin at all
        missing = True
    if launcher.startswith("submitit") and missing:
        sys.exit(f"error: hydra/launcher={launcher} needs Hydra's submitit launcher: pip install -e \".[cluster]\"")


# configs/hydra/launcher/submitit_*.yaml share the plugin's names on purpose, so that Hydra validates them
# against its schema; Hydra 1.3 does so, and warns that this matching is deprecated (hydra-core is pinned <1.4).
warnings.filterwarnings("ignore", message=r"\s*'hydra/launcher/submitit_(slurm|local)' is validated against")

if __name__ == "__main__":
    from cli import check_overrides

    refuse_renamed_options(RENAMED)
    _check_launcher_installed()
    check_overrides("train", "python train.py")
    _quiet_non_main_ranks()
    slurm.quiet_sacct_polling()
    main()
