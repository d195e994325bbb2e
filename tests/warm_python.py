"""Run ``python <script> ...`` as a real process without paying for the interpreter's start each time.

A test of a script's command line wants what a user gets: a process of its own, its exit code, what it wrote
to stdout and stderr, and the files it left. Starting ``python train.py`` costs about 4 s on a 2-core CPU
before the script's first line (torch, Hydra, datasets, wandb...), and the suite runs a few hundred of them.

So each pytest process starts one *warm interpreter* once: a Python that imports those libraries and
headlab's packages, computes nothing, and then waits. For each command it forks a child, which sets the
command's argv, working directory, environment, stdin, stdout and stderr, and runs the script as ``__main__``
(``runpy``, as ``python script.py`` and ``python -m package`` do); the child ends as the interpreter ends a
process (its non-daemon threads joined, its atexit handlers run, its streams flushed; its exit code, an uncaught
exception's traceback, SIGINT after an uncaught KeyboardInterrupt), only without tearing down each imported
module (1.3 s with torch loaded, and nothing a caller can see). Its stdout and stderr are files the caller reads
back.

What a fork cannot give, a real ``subprocess.run`` gives instead (``run_python`` chooses): an environment
that differs from the warm interpreter's in a variable that libraries read when they are imported (torch's
CPU capability and threads, Hugging Face's offline switch and caches, tqdm's and matplotlib's defaults), or
``HEADLAB_COLD_START=1`` (every command a fresh interpreter, as before). A process a test signals while it runs
is a forked child too (``start_python``: a process of its own, with its pid); torchrun's ranks, SLURM's jobs and
the README's lines as typed are real fresh processes.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Variables some library reads once, when it is imported: a command that sets them differently needs its own
# interpreter (the warm one imported those libraries under the test session's values).
READ_AT_IMPORT = ("ATEN_", "CUDA", "HF_", "HUGGINGFACE", "MKL", "MPL", "OMP_", "PYTHON", "PYTORCH", "TORCH",
                  "TQDM_", "TRANSFORMERS", "XDG_", "HOME", "LD_", "PATH")  # fmt: skip
# What the warm interpreter imports before it forks: what most scripts import anyway. Not wandb: its import makes
# a temporary folder that the first child to exit would delete for all the others.
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "numpy", "omegaconf", "hydra", "hydra.main", "tqdm",
           "tiktoken", "matplotlib", "model", "data", "training.loop", "training.config", "analysis.report",
           "cli")  # fmt: skip


def needs_cold_start(env: dict[str, str]) -> str | None:
    """Why a command with environment ``env`` must start its own interpreter, or None."""
    if os.environ.get("HEADLAB_COLD_START") == "1":
        return "HEADLAB_COLD_START=1"
    for key in set(env) | set(os.environ):
        if key.startswith(READ_AT_IMPORT) and env.get(key) != os.environ.get(key):
            return f"{key} differs"
    return None


class WarmPython:
    """The warm interpreter of this pytest process: started on first use, one command at a time."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.scratch = Path(tempfile.mkdtemp(prefix="headlab-warm-"))
        self.count = 0
        self.current: WarmProcess | None = None  # the child last started
        self.silent = True  # the imports printed nothing (else forks would hide it: commands start cold)

    def ready(self) -> bool:
        """Started (now, if not yet), and its imports printed nothing."""
        with self.lock:
            self.start()
        return self.silent

    def start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            imports_said = self.scratch / "imports.stderr"
            with open(imports_said, "w") as stderr:
                self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=stderr, cwd=ROOT, text=True)  # fmt: skip
            ready = self.proc.stdout.readline()
            if ready.strip() != "ready":
                raise RuntimeError(f"the warm interpreter did not start: {imports_said.read_text()[-3000:]}")
            # A fresh process would print what the imports printed (a warning, say) before its own lines: a
            # fork cannot, so then every command starts cold.
            self.silent = not imports_said.read_text()
        return self.proc

    def spawn(self, args: list[str], cwd, env: dict[str, str], input: str | None,
              umask: int | None) -> WarmProcess:  # fmt: skip
        """Fork a child running ``python *args``; the interpreter serves nobody else until it is waited for."""
        self.lock.acquire()
        try:
            self.count += 1
            files = {name: self.scratch / f"{self.count}.{name}" for name in ("stdin", "stdout", "stderr")}
            files["stdin"].write_text(input or "")
            proc = self.start()
            request = {"args": args, "cwd": str(cwd), "env": env, "umask": umask,
                       **{k: str(v) for k, v in files.items()}}  # fmt: skip
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            self.current = WarmProcess(self, [sys.executable, *args], int(proc.stdout.readline()), files)
            return self.current
        except BaseException:
            self.lock.release()
            raise

    def run(self, args: list[str], cwd, env: dict[str, str], input: str | None, timeout: float | None,
            umask: int | None) -> subprocess.CompletedProcess:  # fmt: skip
        return self.spawn(args, cwd, env, input, umask).wait(timeout)

    def end_abandoned(self) -> None:
        """Kill and reap the child that a test started and never waited for (it failed first): else the next
        command would wait for the interpreter forever."""
        if self.current is not None and not self.current.waited:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.current.pid, signal.SIGKILL)
            self.current.wait()
        self.current = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


class WarmProcess:
    """A forked child, as far as a test needs one: its pid (to signal it), then its end (``wait``)."""

    def __init__(self, warm: WarmPython, args: list[str], pid: int, files: dict[str, Path]) -> None:
        self.warm, self.args, self.pid, self.files = warm, args, pid, files
        self.result: subprocess.CompletedProcess | None = None
        self.waited = False  # its end read (and the interpreter freed), even when that timed out

    def running(self) -> bool:
        """Whether it has not ended: a zombie (ended, not yet reaped by the warm interpreter) has."""
        if self.waited:
            return False
        try:
            return Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:  # reaped
            return False

    def wait(self, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Its exit code, stdout and stderr (killed, and ``subprocess.TimeoutExpired``, after ``timeout`` s)."""
        if self.result is not None:
            return self.result
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            os.kill(self.pid, 9)

        timer = threading.Timer(timeout, kill) if timeout else None
        if timer:
            timer.start()
        try:
            returncode = int(self.warm.proc.stdout.readline())
        finally:
            if timer:
                timer.cancel()
            self.waited = True
            self.warm.lock.release()
        stdout, stderr = (self.files[name].read_text(errors="replace") for name in ("stdout", "stderr"))
        for path in self.files.values():
            path.unlink()
        if timed_out.is_set():
            raise subprocess.TimeoutExpired(self.args, timeout, stdout, stderr)
        self.result = subprocess.CompletedProcess(self.args, returncode, stdout, stderr)
        return self.result


_WARM = WarmPython()
atexit.register(lambda: _WARM.close())


def end_abandoned() -> None:
    """After each test (tests/conftest.py): a child it left running is killed, the interpreter freed."""
    _WARM.end_abandoned()


def start_python(args: list[str], cwd, env: dict[str, str] | None = None) -> WarmProcess:
    """``python *args`` started (forked from the warm interpreter) and left running: the test signals it by its
    ``pid``, then ``wait``s for it. No other warm command runs meanwhile."""
    return _WARM.spawn(list(args), cwd, dict(os.environ if env is None else env), None, None)


def run_python(args: list[str], cwd, env: dict[str, str] | None = None, input: str | None = None,
               timeout: float | None = None, umask: int | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """``subprocess.run([python, *args], cwd=cwd, env=env, input=input, capture_output=True, text=True,
    timeout=timeout)`` (with ``umask`` set in the process, if given), forked from the warm interpreter where that
    is the same thing (see the module's doc). ``args`` start with a script's path, ``-m package`` or ``-c code``."""
    env = dict(os.environ if env is None else env)
    if not needs_cold_start(env) and (args[0] in ("-m", "-c") or not args[0].startswith("-")) and _WARM.ready():
        return _WARM.run(list(args), cwd, env, input, timeout, umask)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, input=input, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=None if umask is None else lambda: os.umask(umask))


# The warm interpreter's side.


def _serve() -> None:
    """Import, say ready, then for each request line: fork a child that runs it; reply its pid, then its exit
    code (negative: the signal that ended it)."""
    import gc
    import importlib

    sys.path[:] = [str(ROOT), *(p for p in sys.path[1:] if Path(p).resolve() != ROOT / "tests")]
    for module in PRELOAD:
        importlib.import_module(module)
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing the imports print reaches the replies
    reply.write("ready\n")
    reply.flush()
    gc.freeze()  # the imports are never garbage: a child's collections skip them (and leave their pages shared)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            reply.close()
            _child(request)  # never returns: the script's exit ends the child's interpreter
        reply.write(f"{pid}\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(f"{os.waitstatus_to_exitcode(status)}\n")
        reply.flush()


def _child(request: dict) -> None:
    """Become ``python *args``: its streams, directory, environment, argv and fresh random states; run; exit."""
    import random
    import runpy

    import numpy

    write = os.O_WRONLY | os.O_CREAT
    for fd, name, flags in ((0, "stdin", os.O_RDONLY), (1, "stdout", write), (2, "stderr", write)):
        opened = os.open(request[name], flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin.close()
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process's own stdin, as a fresh interpreter has it)
    os.chdir(request["cwd"])
    if request["umask"] is not None:
        os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fresh interpreter's seeds, not the warm one's (shared by every fork)
    numpy.random.seed()
    interrupted = False
    try:
        _run(request["args"])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
        if not isinstance(exit_.code, int | None):
            print(exit_.code, file=sys.stderr)
    except BaseException as err:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>", runpy.__file__):
            tb = tb.tb_next  # the script's frames, as a fresh interpreter shows them
        sys.excepthook(type(err), err.with_traceback(tb), tb)
        code, interrupted = 1, isinstance(err, KeyboardInterrupt)
    _exit(code, interrupted)


def _run(args: list[str]) -> None:
    import runpy
    import types

    if args[0] == "-m":
        sys.argv, sys.path[0] = [args[1], *args[2:]], os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv, sys.path[0] = ["-c", *args[2:]], ""
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(args[1], "<string>", "exec"), main.__dict__)
    else:
        script = os.path.abspath(args[0])
        sys.argv, sys.path[0] = [args[0], *args[1:]], os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")


def _exit(code: int, interrupted: bool) -> None:
    """End as the interpreter ends a process (wait for its non-daemon threads, run its atexit handlers, flush its
    streams, exit with ``code``, or by SIGINT after an uncaught KeyboardInterrupt), without tearing down every
    imported module one by one: that takes 1.3 s with torch loaded, and nothing observable happens in it."""
    import atexit
    import signal
    import threading

    threading._shutdown()  # as Py_FinalizeEx does first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
