"""A throw-away, single-node SLURM cluster in a temporary folder (for tests).

Tested on Debian 12 with ``apt-get install -y slurm-wlm munge`` (slurm 22.05.8,
munge 0.5.15), as root on a 2-core machine: start ~0.3 s, stop ~0.1-0.5 s.
The tests in test_cluster_sweeps.py start one through the ``slurm`` fixture (conftest.py).
Everything the daemons write (config, munge key/socket/log/pid, slurmctld
state, slurmd spool, logs, pid files) lives under the folder you pass in; the
daemons listen on two free TCP ports picked at start, so two clusters (or a
stale one) never collide.  Use a fresh folder each time: slurmctld recovers
jobs from a reused StateSaveLocation.

Usage::

    from slurm_cluster import cannot_start_reason, slurm_cluster

    reason = cannot_start_reason()
    if reason:
        pytest.skip(reason)
    with slurm_cluster(tmp_path, sacct_shim=True) as cluster:
        env = {**os.environ, **cluster.env}       # SLURM_CONF=<tmp>/slurm.conf (+ PATH with the sacct shim)
        subprocess.run(["srun", "-n2", "hostname"], env=env, check=True)
        # in-process clients (submitit, hydra-submitit-launcher): monkeypatch.setenv each of cluster.env

The daemons run in the foreground (``-D`` / ``-F``) as children of this
process, each in its own session, with a marker variable in their environment
(``SLURM_TEST_CLUSTER=<folder>``) that slurmstepd inherits from slurmd.  Job
processes get the *submitter's* environment, so they are found as descendants
of slurmstepd.  On exit: all jobs are cancelled (SIGKILLed after
``kill_wait``), ``scontrol shutdown`` stops slurmctld and slurmd, every
remaining process carrying the marker, plus its descendants, is SIGKILLed,
and munged is stopped last.  ``kill_stale_clusters()`` cleans up after a test
process that was itself killed (its daemons survive it: own sessions).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "SLURM_TEST_CLUSTER"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "squeue", "sbatch", "srun", "scontrol", "scancel", "munge")
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    return shutil.which(name, path=path)


def cannot_start_reason() -> str | None:
    """Why a test cluster cannot start here, or None if it should.

    Cheap (no daemons started): checks platform, root, and the binaries of the
    Debian packages ``slurm-wlm`` and ``munge`` (slurmctld, slurmd, clients,
    munged)."""
    if not sys.platform.startswith("linux"):
        return f"SLURM test cluster needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "SLURM test cluster needs root (SlurmUser=root, slurmd and munged run as root)"
    missing = [b for b in (*DAEMONS, *CLIENTS) if _which(b) is None]
    if missing:
        return (
            "SLURM test cluster needs the Debian packages slurm-wlm and munge "
            f"(apt-get install -y slurm-wlm munge); missing: {', '.join(missing)}"
        )
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_config() -> tuple[int, int]:
    """(CPUs, RealMemory MiB) as slurmd itself detects them (``slurmd -C``)."""
    cpus, mem = os.cpu_count() or 1, 1024
    try:
        out = subprocess.run([_which("slurmd") or "slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
        for tok in out.split():
            k, _, v = tok.partition("=")
            if k == "CPUs":
                cpus = int(v)
            elif k == "RealMemory":
                mem = int(v)
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return cpus, mem


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    partition: str
    cpus: int
    ctld_port: int
    slurmd_port: int
    munge_socket: Path
    logs: dict[str, Path]
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    # -- client helpers -------------------------------------------------
    def run(self, *args: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """Run a client command (``cluster.run("squeue", "-h")``) against this cluster."""
        env = {**os.environ, **self.env, **kw.pop("env", {})}
        return subprocess.run(list(args), env=env, capture_output=True, text=True, check=check, timeout=timeout, **kw)

    def job_ids(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i", check=False).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def job_fields(self, job_id: str | int) -> dict[str, str]:
        """The fields of ``scontrol show job -o`` (e.g. JobState, Restarts, BeginTime, Reason)."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id), check=False).stdout
        return dict(tok.partition("=")[::2] for tok in out.split() if "=" in tok)

    def job_field(self, job_id: str | int, key: str) -> str | None:
        """A field of ``scontrol show job -o`` (e.g. JobState, Restarts, BeginTime, Reason)."""
        return self.job_fields(job_id).get(key)

    def start_requeued_now(self, job_id: str | int, restarts: int, timeout: float = 60) -> None:
        """Once the job is requeued for the ``restarts``-th time (back to PENDING), let it start at the scheduler's
        next pass instead of at its BeginTime.

        SLURM holds a requeued job until its old credential expires: BeginTime = requeue + cred_expire + 1 s, and
        cred_expire cannot be under 5 s. A test that requeues a job would wait those 6 s for nothing it proves:
        the requeue, the restart count and the rerun stay SLURM's own. StartTime is one second ahead because
        slurmd refuses a credential issued in the second its job's old one was revoked (ctime <= revoked)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job_fields(job_id)
            if int(fields.get("Restarts") or 0) >= restarts and fields.get("JobState") in ("PENDING", "RUNNING"):
                if fields["JobState"] == "PENDING":  # not RUNNING: the rerun started meanwhile
                    self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now+1", check=False)
                return
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} not requeued {restarts} time(s) after {timeout}s: {self.job_fields(job_id)}")

    def wait_for_state(self, job_id: str | int, states: str | tuple[str, ...], timeout: float = 60) -> str:
        states = (states,) if isinstance(states, str) else states
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.job_field(job_id, "JobState")
            if state in states:
                return state
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} not in {states} after {timeout}s (last: {state})")

    def stray_processes(self) -> list[tuple[int, str]]:
        """(pid, cmdline) of every live process started by this cluster (daemons, slurmstepd, jobs)."""
        return [(p, _cmdline(p)) for p in sorted(_marked_tree(str(self.root)))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _marked_tree(marker_value: str | None) -> set[int]:
    """Pids whose environment has MARKER=marker_value (any value if None), plus all their descendants."""
    needle = f"{MARKER}={marker_value}".encode() if marker_value is not None else f"{MARKER}=".encode()
    marked, children = set(), {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        if pid == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            if (needle in env) if marker_value is not None else any(e.startswith(needle) for e in env):
                marked.add(pid)
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(pid)
        except (OSError, ValueError, IndexError):
            continue
    todo, seen = list(marked), set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(children.get(p, ()))
    return seen


def _marked_roots() -> set[str]:
    """The folders of the test clusters whose processes run now (the marker's values)."""
    roots = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                roots.update(e.partition(b"=")[2].decode() for e in (d / "environ").read_bytes().split(b"\0")
                             if e.startswith(f"{MARKER}=".encode()))  # fmt: skip
    return roots


def _owner_alive(root: str) -> bool:
    """Whether the process that started the cluster in ``root`` (its ``owner`` file) still runs."""
    try:
        os.kill(int((Path(root) / "owner").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def _wait(pred, timeout: float, what: str, logs: dict[str, Path] | None = None, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    tail = ""
    for name, path in (logs or {}).items():
        with contextlib.suppress(OSError):
            tail += f"\n--- {name} ({path}) ---\n" + "\n".join(path.read_text().splitlines()[-15:])
    raise RuntimeError(f"SLURM test cluster: timed out after {timeout}s waiting for {what}{tail}")


def write_config(
    root: Path,
    *,
    node: str,
    cpus: int,
    real_memory: int,
    partition: str,
    ctld_port: int,
    slurmd_port: int,
    munge_socket: Path,
    kill_wait: int,
    requeue_delay: int,
    extra: tuple[str, ...] = (),
) -> Path:
    for sub in ("state", "spool", "log", "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    lines = [
        "ClusterName=testcluster",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # socket=: our munged; cred_expire=: also the delay before a requeued job may start again
        # (BeginTime = requeue time + cred_expire + 1; default 120, minimum 5).
        f"AuthInfo=socket={munge_socket},cred_expire={requeue_delay}",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",  # sacct then fails: see write_sacct_shim
        "JobCompType=jobcomp/none",
        "MailProg=/bin/true",
        # seconds between SIGTERM and SIGKILL on scancel / requeue / time limit (default 30)
        f"KillWait={kill_wait}",
        # the main scheduler also runs every sched_interval s (default 60); with 1 a requeued job starts
        # as soon as its BeginTime passes (~requeue_delay+1 s) instead of up to ~25-60 s later
        "SchedulerParameters=sched_interval=1",
        *extra,
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={real_memory} State=UNKNOWN",
        f"PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


@contextlib.contextmanager
def slurm_cluster(
    root: str | os.PathLike,
    *,
    partition: str = "debug",
    kill_wait: int = 5,
    requeue_delay: int = 5,
    extra_conf: tuple[str, ...] = (),
    start_timeout: float = 60,
    stop_timeout: float = 30,
    sacct_shim: bool = False,
) -> Iterator[SlurmCluster]:
    """Start munged + slurmctld + slurmd under ``root`` and yield a SlurmCluster.

    ``cluster.env`` ({"SLURM_CONF": ...}) is what clients need.  Raises
    RuntimeError (with log tails) if a daemon does not come up; call
    cannot_start_reason() first to skip cleanly.

    kill_wait: KillWait, seconds between SIGTERM and SIGKILL (cancel, requeue, time limit); slurm's default is 30.
    requeue_delay: AuthInfo cred_expire (>= 5): a requeued job's BeginTime is requeue time + this + 1 s.
    sacct_shim: put <root>/bin/sacct first on PATH in cluster.env: it answers submitit's status query
        (``sacct -o JobID,State,NodeList --parsable2 -j ID``) from ``squeue -t all`` because this cluster has
        no accounting (real sacct prints "Slurm accounting storage is disabled" and exits 1).  Without it
        submitit sees every job as UNKNOWN and waits forever for a job that died without a result pickle.
    """
    reason = cannot_start_reason()
    if reason:
        raise RuntimeError(reason)
    if requeue_delay < 5:  # slurm: "error: AuthInfo=cred_expire=1 invalid" and falls back to 120
        raise ValueError("requeue_delay (AuthInfo cred_expire) must be >= 5")
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    (root / "owner").write_text(str(os.getpid()))  # kill_stale_clusters leaves a live owner's cluster alone
    t0 = time.monotonic()
    node = socket.gethostname().split(".")[0]
    cpus, mem = _node_config()
    mdir = root / "munge"
    mdir.mkdir(exist_ok=True)
    # munged refuses a socket dir without o+x ("execute permissions for all required")
    os.chmod(mdir, 0o755)
    os.chmod(root, 0o755)
    key = mdir / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)
    msock = mdir / "munge.socket"
    ports: set[int] = set()
    while len(ports) < 2:
        ports.add(_free_port())
    ctld_port, slurmd_port = list(ports)[:2]
    conf = write_config(
        root,
        node=node,
        cpus=cpus,
        real_memory=mem,
        partition=partition,
        ctld_port=ctld_port,
        slurmd_port=slurmd_port,
        munge_socket=msock,
        kill_wait=kill_wait,
        requeue_delay=requeue_delay,
        extra=tuple(extra_conf),
    )
    logs = {
        "munged": mdir / "munged.log",
        "slurmctld": root / "log" / "slurmctld.log",
        "slurmd": root / "log" / "slurmd.log",
    }
    cluster = SlurmCluster(
        root=root,
        conf=conf,
        node=node,
        partition=partition,
        cpus=cpus,
        ctld_port=ctld_port,
        slurmd_port=slurmd_port,
        munge_socket=msock,
        logs=logs,
        env={"SLURM_CONF": str(conf)},
    )
    if sacct_shim:
        bindir = root / "bin"
        bindir.mkdir(exist_ok=True)
        write_sacct_shim(bindir / "sacct")
        cluster.env["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
    denv = {**os.environ, "SLURM_CONF": str(conf), MARKER: str(root)}

    def spawn(name: str, argv: list[str]) -> None:
        out = open(root / "log" / f"{name}.stdout", "ab")  # noqa: SIM115
        cluster.procs[name] = subprocess.Popen(
            argv,
            env=denv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=root,
        )
        out.close()

    def alive(name: str) -> bool:
        p = cluster.procs.get(name)
        if p is not None and p.poll() is not None:
            raise RuntimeError(
                f"SLURM test cluster: {name} exited with {p.returncode}; see {logs.get(name)} and "
                f"{root / 'log' / (name + '.stdout')}:\n"
                + _tail(root / "log" / f"{name}.stdout")
                + _tail(logs.get(name))
            )
        return True

    try:
        spawn(
            "munged",
            [
                _which("munged"),
                "-F",
                f"--socket={msock}",
                f"--key-file={key}",
                f"--log-file={logs['munged']}",
                f"--pid-file={mdir / 'munged.pid'}",
                f"--seed-file={mdir / 'munged.seed'}",
            ],
        )
        _wait(
            lambda: (
                alive("munged")
                and subprocess.run([_which("munge"), "-n", "-S", str(msock)], capture_output=True).returncode == 0
            ),
            start_timeout,
            "munged",
            logs,
        )
        cluster.timings["munged"] = time.monotonic() - t0
        spawn("slurmctld", [_which("slurmctld"), "-D", "-f", str(conf)])
        _wait(
            lambda: alive("slurmctld") and "UP" in cluster.run("scontrol", "ping", check=False).stdout,
            start_timeout,
            "slurmctld (scontrol ping)",
            logs,
        )
        cluster.timings["slurmctld"] = time.monotonic() - t0
        spawn("slurmd", [_which("slurmd"), "-D", "-f", str(conf), "-N", node])

        def idle() -> bool:
            alive("slurmd")
            alive("slurmctld")
            return cluster.run("sinfo", "-h", "-n", node, "-o", "%T", check=False).stdout.strip() == "idle"

        _wait(idle, start_timeout, f"node {node} idle in sinfo", logs)
        cluster.timings["start"] = time.monotonic() - t0
        yield cluster
    finally:
        t1 = time.monotonic()
        _stop(cluster, stop_timeout)
        cluster.timings["stop"] = time.monotonic() - t1


SACCT_SHIM = r"""#!/bin/sh
# Test-cluster stand-in for sacct (the cluster runs without accounting).  Answers the query submitit makes,
#   sacct -o JobID,State,NodeList --parsable2 -j ID [-j ID ...]
# from slurmctld's memory (squeue -t all: jobs stay there MinJobAge=300 s after they end); anything else
# goes to the real sacct.
case " $* " in
  *" -o JobID,State,NodeList "*"--parsable2 "*) ;;
  *) exec /usr/bin/sacct "$@" ;;
esac
ids=""
while [ $# -gt 0 ]; do
  case "$1" in
    -j) ids="${ids:+$ids,}$2"; shift 2 ;;
    *) shift ;;
  esac
done
echo "JobID|State|NodeList"
[ -n "$ids" ] && squeue -h -t all -o "%i|%T|%N" -j "$ids" 2>/dev/null
exit 0
"""


def write_sacct_shim(path: Path) -> Path:
    path.write_text(SACCT_SHIM)
    path.chmod(0o755)
    return path


def kill_stale_clusters(root: str | os.PathLike | None = None) -> list[tuple[int, str]]:
    """SIGKILL leftovers of earlier test clusters (e.g. after the test process itself was killed).

    Only processes this module started carry the marker; with ``root`` only that cluster's, otherwise those of
    every test cluster whose test process has ended (another test session's live cluster is left alone: pytest
    -n runs several at once).  Returns the (pid, cmdline) killed."""
    roots = [str(Path(root).resolve())] if root is not None else [r for r in _marked_roots() if not _owner_alive(r)]
    pids = set().union(*(_marked_tree(r) for r in roots))
    killed = [(p, _cmdline(p)) for p in sorted(pids)]
    for pid, _ in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return killed


def _tail(path: Path | None, n: int = 15) -> str:
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) + "\n"
    except OSError:
        return ""


def _stop(cluster: SlurmCluster, timeout: float) -> None:
    procs = cluster.procs
    ctld = procs.get("slurmctld")
    if ctld is not None and ctld.poll() is None:
        # 1. cancel every job; slurmstepd sends SIGCONT+SIGTERM, then SIGKILL after KillWait
        ids = cluster.job_ids()
        if ids:
            cluster.run("scancel", *ids, check=False)
            with contextlib.suppress(RuntimeError):
                _wait(lambda: not cluster.job_ids(), timeout, "jobs to finish after scancel", interval=0.2)
        # 2. slurmctld forwards the shutdown to slurmd
        cluster.run("scontrol", "shutdown", check=False, timeout=10)
    deadline = time.monotonic() + timeout
    for name in ("slurmd", "slurmctld"):
        p = procs.get(name)
        if p is None:
            continue
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
    # 3. anything left (slurmstepd of an unfinished step, job processes, a daemon child)
    for _ in range(3):
        left = _marked_tree(str(cluster.root)) - {p.pid for n, p in procs.items() if n == "munged"}
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
    # 4. munged last (slurmstepd needs it to report completion)
    m = procs.get("munged")
    if m is not None and m.poll() is None:
        m.terminate()
        try:
            m.wait(timeout=5)
        except subprocess.TimeoutExpired:
            m.kill()
            m.wait(timeout=5)
