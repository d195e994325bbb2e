"""Train a GPT: ``python train.py [group=option ...] [key=value ...]``.

    python train.py                                   # nano GPT on the embedded corpus, CPU, minutes
    python train.py attention=wrapper kernel=manual
    python train.py -m attention=wrapper,separate_qkv,fused_qkv kernel=manual,sdpa
    torchrun --standalone --nproc_per_node=8 train.py experiment=gpt2_small

``python train.py --help`` lists the config groups and every option.
"""

from __future__ import annotations

from common.startup import guard_start_up

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import contextlib
import importlib.util
import itertools
import logging
import os
import signal
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from cli import refuse_renamed_options, set_by, user_errors
from cli.console import to_the_terminal
from common.optim_label import LABELLED as OPTIM_LABELLED
from common.run_files import OWNER, RUN_INFO, remove_husk
from model.config import LABEL_AXES, label_grammar
from training import slurm
from training.config import TrainConfig  # noqa: F401  (registers the config schema with Hydra)
from training.continuation import STOP_AT_STEP, continue_command
from training.distributed import from_environment, relaunch_prefix
from training.loop import RunFailed, train
from training.plan import plan_variants
from training.run_log import run_label

USAGE = "python train.py [group=option ...] [key=value ...]; python train.py --help lists them"
RENAMED = {
    "attention.layout": "attention",
    "attention.kernel": "kernel",
    "model.layout": "attention",
}


def _quiet_non_main_ranks() -> None:
    """Under torchrun (or srun) only rank 0 writes: the other ranks' Hydra keeps no output directory or log. A run
    directory the command names (``hydra.run.dir``, as a printed continue command does) stays every rank's: each
    rank reads from it what ``trainer.resume=auto`` continues (the ranks' default directories, made from the clock,
    may differ)."""
    if not from_environment().is_main:
        named = any(arg.startswith("hydra.run.dir=") for arg in sys.argv[1:])
        sys.argv += [
            *([] if named else [f"hydra.run.dir={tempfile.gettempdir()}"]),
            "hydra.output_subdir=null",
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ]


def swept_keys(hydra_cfg) -> list[str]:
    """The keys a multirun varies: its sweeper's params and its command line's sweeps (``kernel=sdpa,manual``,
    ``trainer.seed=range(1,4)``), read from the sweep's multirun.yaml where Hydra wrote it: a job that a SLURM
    launcher runs has submitit's command line, not the user's. A param of one value varies nothing."""
    args = [f"{key}={value}" for key, value in (hydra_cfg.sweeper.get("params") or {}).items()]
    saved = Path(hydra_cfg.sweep.dir) / "multirun.yaml"
    args += (list(_sweep_command_line(str(saved), saved.stat().st_mtime_ns)) if saved.exists()
             else [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")])  # fmt: skip
    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except OverrideParseException:  # Hydra has already refused a command line it cannot parse
        overrides = []
    swept = [o.get_key_element() for o in overrides if o.is_sweep_override()]
    return [key for key in dict.fromkeys(swept) if not key.startswith("hydra")]


_SWEEP_COMMAND_LINES: dict[tuple[str, int], tuple[str, ...]] = {}  # a dict, not an lru_cache: submitit pickles this


def _sweep_command_line(multirun_yaml: str, mtime_ns: int) -> tuple[str, ...]:
    """The sweep's command-line overrides in its multirun.yaml, read once per job (a job names its folder, its run
    and its label from them: the whole config parsed four times otherwise)."""
    key = (multirun_yaml, mtime_ns)
    if key not in _SWEEP_COMMAND_LINES:
        _SWEEP_COMMAND_LINES[key] = tuple(str(a) for a in OmegaConf.load(multirun_yaml).hydra.overrides.task)
    return _SWEEP_COMMAND_LINES[key]


# Swept keys that a run's directory already spells (run_label: attention_label's -kv2, -window64, sdpa_flash, -rope,
# whose axes the groups score_mods, kv_cache, length_variant, schedule and mixing set; then the data; then the
# optimizer and schedule where not AdamW and cosine: -muon_qkv, -wsd); the others join its name.
IN_THE_LABEL = ("attention", "kernel", "score_mods", "kv_cache", "length_variant", "schedule", "mixing",
                "model.attention", "model.kernel", "model.sdpa_backend",
                *(f"model.{axis}" for axis in LABEL_AXES), "data", "data.name", "data.path",
                "optim", *(f"optim.{key}" for key in OPTIM_LABELLED))  # fmt: skip
NAMED_BY_DEFAULT = (*IN_THE_LABEL, "model", "model.name")  # a run name says these too


# The config groups whose options may set a schedule of layers, in the order configs/train.yaml's defaults list
# composes them: where several are chosen, the last that sets model.layer_pattern made the model's layers.
SCHEDULE_GROUPS = ("length_variant", "schedule", "mixing", "attention_2026")
CONFIGS = Path(__file__).resolve().parent / "configs"


def schedule_preset(choices, layer_pattern: str | None) -> str | None:
    """The option that chose the model's schedule of layers (``mixing=kimi_linear``: ``kimi_linear``), from the
    command's choices (Hydra's ``runtime.choices``); None for a model whose layers are alike, or a schedule the
    command line spelled (``model.layer_pattern=...``) after no preset, or after one whose layers are alike."""
    preset = None
    for group in SCHEDULE_GROUPS:  # the last chosen option that sets the layers made them
        option = choices.get(group)
        pattern = layers_set_by(group, option) if option else NOT_SET
        if pattern is not NOT_SET:
            preset = option if pattern else None
    return preset if layer_pattern else None


NOT_SET = object()


def layers_set_by(group: str, option: str):
    """The model.layer_pattern that ``configs/<group>/<option>.yaml`` sets (None: every layer alike), itself or
    through an option its defaults list takes (attention_2026=kimi_linear takes mixing=kimi_linear); NOT_SET where
    it sets none (length_variant=rope, attention_2026=sparse)."""
    path = CONFIGS / group / f"{option}.yaml"
    node = OmegaConf.load(path) if path.is_file() else OmegaConf.create()
    for model in (node, node.get("model") or {}):  # a file of package model, or a global one's model
        if "layer_pattern" in model:
            return model["layer_pattern"]
    for entry in node.get("defaults") or []:
        for inner_group, inner_option in (entry.items() if isinstance(entry, DictConfig) else []):
            pattern = layers_set_by(inner_group.lstrip("/").split("@")[0], inner_option)
            if pattern is not NOT_SET:
                return pattern
    return NOT_SET


def swept_suffix(hydra_cfg, named: tuple[str, ...]) -> str:
    """``-<key>=<value>`` for this job's value of each swept key that ``named`` leaves out, as the user spelled it
    (a ``/`` in a value becomes ``_``: it is part of a directory name)."""
    job = {k.lstrip("+~"): v for k, _, v in (o.partition("=") for o in hydra_cfg.overrides.task)}
    return "".join(f"-{k}={job[k].replace('/', '_')}" for k in swept_keys(hydra_cfg) if k in job and k not in named)


def swept_axes(hydra_cfg) -> list[str]:
    """The label's axes spelled at their default too: those the sweep varies (the key/value heads, ``-kv4``)."""
    swept = swept_keys(hydra_cfg)
    return [axis for axis in LABEL_AXES if f"model.{axis}" in swept or (axis == "n_kv_head" and "kv_cache" in swept)]


def sweep_run_name(cfg: DictConfig, hydra_cfg) -> str | None:
    """The run's label with the model (run_label: how it attends, the model, the data where it is not the default
    corpus, the optimizer and schedule where not AdamW and cosine) and this job's values of the other swept keys:
    ``wrapper-sdpa-kv4-nano``, ``fused_qkv-sdpa-nano-muon_qkv``, ``fused_qkv-sdpa-nano-optim.lr=0.001``; None where
    the run's default name already says it all."""
    model, optim = OmegaConf.to_container(cfg.model, resolve=True), OmegaConf.to_container(cfg.optim, resolve=True)
    preset = cfg.logger.preset
    label = run_label(model, cfg.data, swept_axes(hydra_cfg), cfg.model.name, optim, preset)
    name = label + swept_suffix(hydra_cfg, NAMED_BY_DEFAULT)
    return None if name == run_label(model, cfg.data, model_name=cfg.model.name, optim=optim, preset=preset) else name


def run_dir_name(model: DictConfig, data: DictConfig, optim: DictConfig) -> str:
    """The run directory's name after its time or job number (configs/train.yaml): the run's label as its name
    spells it, less the model (run_label: ``fused_qkv-sdpa``, ``fused_qkv-sdpa-my_notes`` on your own file,
    ``fused_qkv-sdpa-muon_qkv``), and in a multirun the values of the other swept keys: ``1_wrapper-sdpa-kv2``,
    ``3_fused_qkv-sdpa-trainer.seed=2``."""
    with user_errors(USAGE):  # Hydra resolves this before main: a share of the context that rounds down to nothing
        model = OmegaConf.to_container(model, resolve=True)
    optim = OmegaConf.to_container(optim, resolve=True)
    data = SimpleNamespace(name=data.name, path=None if OmegaConf.is_missing(data, "path") else data.path)
    try:
        hydra_cfg = HydraConfig.get()
    except ValueError:  # the config printed outside a run (--cfg hydra): no sweep to read
        return run_label(model, data, optim=optim)
    preset = schedule_preset(hydra_cfg.runtime.choices, model.get("layer_pattern"))  # kimi_linear-mla-sdpa-...
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return run_label(model, data, optim=optim, preset=preset)
    return (run_label(model, data, swept_axes(hydra_cfg), optim=optim, preset=preset)
            + swept_suffix(hydra_cfg, IN_THE_LABEL))


OmegaConf.register_new_resolver("run_dir_name", run_dir_name, replace=True)
# --help's footer spells a run directory's label from the registries (each position encoding's, each modification's)
OmegaConf.register_new_resolver("headlab_label_grammar", label_grammar, replace=True)


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # The only place that reads Hydra's state: train(cfg) gets the run directory, group and name as settings.
    hydra_cfg = HydraConfig.get()
    with no_husk_left(Path(hydra_cfg.runtime.output_dir), cfg):
        return run_command(cfg, hydra_cfg)


HYDRAS_OWN = {".hydra", "train.log"}  # what Hydra writes into a job's folder before the job starts
NO_RUN = {*HYDRAS_OWN, OWNER}  # and a run that claimed it, then stopped before its run.json (Ctrl-C as it started)


@contextlib.contextmanager
def no_husk_left(output_dir: Path, cfg: DictConfig):
    """A command that ends without a run (refused, a plan, a sweep preset without -m, stopped as it started)
    removes the folder Hydra made for it, and the folders above it that this leaves empty (inside the working
    directory): they would later look like a run. Kept: a folder holding anything a run writes, and Hydra's folder
    (its train.log) of a command whose run is elsewhere (trainer.run_dir), found there."""
    try:
        yield
    finally:
        run_dir = cfg.trainer.run_dir  # set by run_command unless the command was refused before
        ran = not cfg.trainer.plan and run_dir is not None and (Path(run_dir) / RUN_INFO).exists()
        if from_environment().is_main and not ran:
            remove_husk(output_dir, NO_RUN)


def run_command(cfg: DictConfig, hydra_cfg) -> float | None:
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
    if cfg.logger.preset is None:  # before the name, which opens with it
        cfg.logger.preset = schedule_preset(hydra_cfg.runtime.choices, cfg.model.layer_pattern)
    if multirun and cfg.logger.name is None:
        cfg.logger.name = sweep_run_name(cfg, hydra_cfg)
    with errors_for_the_launcher():
        typed = list(hydra_cfg.overrides.task)
        with user_errors(USAGE, as_typed=lambda message: set_by(message, typed, "train")):
            try:
                summary = train(cfg)
            except RunFailed as err:
                if not multirun:
                    raise  # one line: user_errors
                # One variant failing (out of memory, a diverged loss) must not end the sweep: it is recorded in
                # its failure.json, the rest go on.
                print(f"[train] job {hydra_cfg.job.num} failed: {err}", file=sys.stderr, flush=True)
                return None
    if summary.get("requeued"):  # no result: the launcher waits for the rerun, which continues the run
        raise SystemExit(0)
    if summary.get("stopped_by") and slurm.in_slurm_job() and os.environ.get("SUBMITIT_EXECUTOR"):
        # scancel, or a time limit without the warning: half a run is no job's result
        from training.job_errors import JobUserError

        raise JobUserError(f"error: job {hydra_cfg.job.num} ({summary['run_dir']}) was stopped by "
                           f"{summary['stopped_by']} at step {summary['step']} of {cfg.trainer.max_steps} (scancel, "
                           f"or its time limit) and saved its last.pt: run the sweep's command again with "
                           f"hydra.sweep.dir={os.path.abspath(hydra_cfg.sweep.dir)} trainer.resume=auto to "
                           f"continue it")  # fmt: skip
    if (summary.get("stopped_by") or summary.get("signal")) and not slurm.in_slurm_job():
        stop_here(summary, hydra_cfg, multirun)
    return summary.get("val_loss")  # what a Hydra sweeper would optimise


def stop_here(summary: dict, hydra_cfg, multirun: bool) -> None:
    """A signal stopped the run (or came as it finished): no later job of a sweep starts; say how to continue;
    exit 128 + signal. trainer.stop_at_step stopped it: say how to continue; a sweep goes on."""
    stopper = summary.get("stopped_by") or summary["signal"]
    by_signal = stopper != STOP_AT_STEP
    if from_environment().is_main:
        sweep_dir = os.path.abspath(hydra_cfg.sweep.dir) if multirun else None
        command = continue_command(sys.argv[1:], sweep_dir, os.path.abspath(hydra_cfg.runtime.output_dir), stopper,
                                   relaunch_prefix())  # fmt: skip
        what = ("the sweep: finished jobs are skipped, this one continues from its last.pt, the rest start"
                if multirun else "the run from its last.pt, in the same directory")  # fmt: skip
        if not by_signal:
            what = "the sweep once it has ended (each job from its last.pt)" if multirun else what
            said(f"[train] stopped at step {summary['step']} (trainer.stop_at_step). Continue {what}:\n  {command}")
            return
        if summary.get("stopped_by") is None:  # it came as the run finished: nothing to continue but the sweep
            later = "; no later job of the sweep was started. Continue the sweep (this job is skipped)"
            said(f"[train] {stopper} came as the run finished its last step (step {summary['step']}): it is "
                 f"finished{later + f':{chr(10)}  {command}' if multirun else ''}")  # fmt: skip
        else:
            said(f"[train] stopped by {stopper} at step {summary['step']}"
                 f"{'; no later job of the sweep was started' if multirun else ''}. Continue {what}:\n  {command}")
    if by_signal:
        raise SystemExit(128 + signal.Signals[stopper].value)


def said(text: str) -> None:
    """A line for the user on stderr, and in the run's train.log: output piped into a program that has ended
    (``| tee log`` after Ctrl-C) still leaves it where the run is, and on the terminal the command was typed in."""
    print(text, file=sys.stderr, flush=True)
    logs = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(logging.LogRecord("headlab.train", logging.WARNING, __file__, 0, text, None, None))
            logs.append(handler.baseFilename)
    if logs:
        text += f"\n  (the program reading this command's output has exited: this is also in {logs[0]})"
    to_the_terminal(text)


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
        try:
            configs[" ".join(variant)] = OmegaConf.to_object(compose(config_name="train", overrides=base + variant))
        except ValueError as err:  # one variant the config refuses: named, in one line, before any plan
            sys.exit(f"error: {' '.join(variant)}: {err}")
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
    from cli.console import outlive_the_reader

    outlive_the_reader()  # Ctrl-C on `python train.py | tee log` ends tee too: the run still saves and says so
    refuse_renamed_options(RENAMED)
    _check_launcher_installed()
    check_overrides("train", "python train.py")
    _quiet_non_main_ranks()
    slurm.quiet_sacct_polling()
    main()
