"""Hydra's submitit launchers (``hydra/launcher=submitit_slurm|submitit_local``), with errors a user can fix
said in one line, as a local run says them, instead of the launcher's traceback:

- sbatch refusing the jobs (``Invalid generic resource (gres) specification``: one GPU per job asked of a
  cluster without GPUs) names what was asked and the option that changes it;
- a user error inside a job (a batch that does not split, a bad value) ends the sweep with that job's own
  one-line message.

configs/hydra/launcher/*.yaml name these classes as their ``_target_``. Hydra takes launchers only from the
``hydra_plugins`` namespace, and finds this one beside train.py. The jobs themselves run the plugin's own
launcher (what they unpickle needs nothing from here).
"""

from __future__ import annotations

from training.job_errors import JobUserError

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher
except ImportError:  # the cluster extra is not installed: nothing to wrap (train.py says how to install it)
    submitit_launcher = None


class OneLineErrors:
    PLUGIN: type

    def launch(self, job_overrides, initial_job_idx):
        plain = self.PLUGIN(**self.params)
        plain.setup(hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
        try:
            results = plain.launch(job_overrides, initial_job_idx)
        except Exception as err:
            message = refused_submission(err, self.params)
            if message is None:
                raise
            raise SystemExit(message) from None
        errors = [r._return_value for r in results if isinstance(getattr(r, "_return_value", None), JobUserError)]
        if errors:  # the same line a local run prints (once per distinct error), not a traceback
            raise SystemExit("\n".join(dict.fromkeys(str(e) for e in errors)))
        return results


def refused_submission(err: BaseException, params: dict) -> str | None:
    """One line for sbatch refusing the jobs, or None for any other failure (which keeps its traceback)."""
    if type(err).__name__ != "FailedJobError" or "sbatch: error" not in str(err):
        return None
    said = next(line for line in str(err).splitlines() if "sbatch: error" in line).split("sbatch: error:")[-1].strip()
    gpus = params.get("gpus_per_node")
    if "gres" in said.lower() and gpus:
        plural = "s" if gpus != 1 else ""
        return (f"error: sbatch refused the jobs ({said}): each job asks for {gpus} GPU{plural} "
                f"(hydra.launcher.gpus_per_node={gpus}) and this cluster or partition has none; on a CPU cluster add "
                f"hydra.launcher.gpus_per_node=0, or choose a GPU partition (hydra.launcher.partition=...)")
    return (f"error: sbatch refused the jobs ({said}); their settings are the hydra.launcher.* options "
            f"(configs/hydra/launcher/submitit_slurm.yaml): partition, account, qos, gpus_per_node, timeout_min")


if submitit_launcher is not None:

    class SlurmLauncher(OneLineErrors, submitit_launcher.SlurmLauncher):
        PLUGIN = submitit_launcher.SlurmLauncher

    class LocalLauncher(OneLineErrors, submitit_launcher.LocalLauncher):
        PLUGIN = submitit_launcher.LocalLauncher
