"""The error a job of Hydra's submitit launcher raises for a user's mistake, so that the launcher, in the
process that submitted the sweep, prints it as the one line a local run prints (hydra_plugins/headlab_launchers)."""


class JobUserError(RuntimeError):
    """A job's one-line error (``error: ...``): a user's mistake, or a job stopped before it finished."""
