"""Test-wide settings: everything offline, every cache in a temporary folder.

These variables are read when `datasets`, `huggingface_hub` and `tiktoken`
are first imported, so they are set here, before any test module imports them.
"""

from __future__ import annotations

import os
import tempfile

_SCRATCH = tempfile.mkdtemp(prefix="headlab-tests-")
_USER_TIKTOKEN_CACHE = os.environ.get("TIKTOKEN_CACHE_DIR")  # before the line below replaces it
os.environ["HEADLAB_CACHE"] = os.path.join(_SCRATCH, "headlab")  # prepared data never lands in the home folder
os.environ["HF_HUB_OFFLINE"] = "1"  # the hub is unreachable: fail at once instead of retrying
os.environ["HF_DATASETS_CACHE"] = os.path.join(_SCRATCH, "hf-datasets")
os.environ["TIKTOKEN_CACHE_DIR"] = os.path.join(_SCRATCH, "tiktoken")  # empty: gpt2 & co. are offline
os.environ["WANDB_MODE"] = "offline"
os.environ["WANDB_DIR"] = os.path.join(_SCRATCH, "wandb")
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # pytest -n: each worker (and every process it starts) gets its share of the cores, set before torch is
    # imported; two workers of two OpenMP threads each on two cores would spin against each other.
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_threads, _share)


import pytest  # noqa: E402

from model.device import inductor_cache_per_cpu_capability  # noqa: E402

inductor_cache_per_cpu_capability()  # for the tests that call torch.compile themselves

if not os.environ.get("TORCH_TRACE"):
    import logging

    # torch.compile writes empty DEBUG records to its structured-trace logger (for TORCH_TRACE): a failing test's
    # report would list hundreds of blank "DEBUG torch.__trace" lines above what went wrong.
    logging.getLogger("torch.__trace").setLevel(logging.INFO)


@pytest.fixture(autouse=True, scope="session")
def many_compiled_shapes():
    """The suite compiles flex and decode steps for dozens of shapes in one process (each test its own heads and
    batch sizes): torch's default limit of 8 graphs per function would quietly send later tests to eager code."""
    import torch

    with torch._dynamo.config.patch(recompile_limit=64):
        yield


@pytest.fixture(autouse=True, scope="module")
def heap_so_far_frozen():
    """Each run's memory meter collects garbage (training/memory.py): in the test process that would walk every
    object of the session too (pytest, every module imported), a good part of a tiny run's time. Frozen, they are
    left out; what the tests make is collected as before."""
    import gc

    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def no_warm_child_left():
    """A test that fails while a process it forked from the warm interpreter runs (tests/warm_python.py) leaves
    it killed, not the interpreter waiting on it: the worker's next tests would hang."""
    yield
    from warm_python import end_abandoned

    end_abandoned()


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory):
    """One prepared-data cache for the whole session, the corpus tokenized once: pytest -n's workers share it
    (headlab's lock on a folder being prepared makes one of them prepare it, the others wait and read it)."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "data-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture
def log_lines(caplog):
    """The trainer's log messages so far (a callable: call it after the run)."""
    import logging

    caplog.set_level(logging.INFO, logger="headlab.train")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "headlab.train"]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, data_cache):
    """A checkpoint from a real (tiny) training run, shared by the sampling and head-analysis tests."""
    from helpers import tiny_run

    return tiny_run(tmp_path_factory.mktemp("trained") / "run", data_cache, "trainer.max_steps=30")


R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"


def _gpt2_ranks() -> str | None:
    """GPT-2's BPE rank file (tiktoken's r50k_base.tiktoken), if this machine has one offline: named by
    HEADLAB_GPT2_RANKS, in the tiktoken cache the user had before the tests replaced it (a run with the network
    put it there), or in the shared/ folder beside the project's CI checkout."""
    import hashlib

    cached = hashlib.sha1(R50K_URL.encode()).hexdigest()
    user_cache = _USER_TIKTOKEN_CACHE or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    candidates = [os.environ.get("HEADLAB_GPT2_RANKS"), os.path.join(user_cache, cached),
                  os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "gpt2.tiktoken")]  # fmt: skip
    return next((os.path.abspath(c) for c in candidates if c and os.path.isfile(c)), None)


GPT2_RANKS = _gpt2_ranks()
NO_GPT2_RANKS = ("GPT-2's BPE ranks are not on this machine and the tests are offline: set HEADLAB_GPT2_RANKS to a "
                 "copy of tiktoken's r50k_base.tiktoken, or run any gpt2-tokenizer command once with the network")


@pytest.fixture
def gpt2_tokenizer_offline(tmp_path, monkeypatch):
    """Real GPT-2 BPE without the network: the shipped rank file, in tiktoken's own cache."""
    import hashlib
    import shutil

    import tiktoken.registry

    if GPT2_RANKS is None:
        pytest.skip(NO_GPT2_RANKS)
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    shutil.copy(GPT2_RANKS, cache / hashlib.sha1(R50K_URL.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # loaded here, forgotten afterwards
    from data.tokenizers import get_tokenizer

    return get_tokenizer("gpt2")


@pytest.fixture(scope="session")
def slurm():
    """A real single-node SLURM (slurmctld, slurmd, munged) for the session, in a folder of its own under /tmp
    (munged needs every folder above its socket to be world-executable: pytest's tmp folders are not).
    Skipped, with the reason, where it cannot start: not root, or the Debian packages missing."""
    import shutil

    from slurm_cluster import cannot_start_reason, kill_stale_clusters, slurm_cluster

    reason = cannot_start_reason()
    if reason:
        pytest.skip(reason)
    kill_stale_clusters()  # daemons of a test session that was itself killed
    root = tempfile.mkdtemp(prefix="headlab-slurm-")
    try:
        with slurm_cluster(root, sacct_shim=True) as cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--deep", action="store_true", help="the deep property sweep: lengths 1-40, then primes and "
                     "block edges to 257, more windows, each plain cell in its other head shape, every compiled "
                     "cell")  # fmt: skip
    parser.addoption("--slow", action="store_true", help="the slow tier alone: the tests marked slow, which the "
                     "README's `pytest -n auto` leaves out (real clusters, whole sweeps and guides' commands in "
                     "processes of their own); CI runs both tiers")  # fmt: skip


def pytest_configure(config):
    config.addinivalue_line("markers", "deep: runs only with --deep (CI runs it after the default suite)")
    config.addinivalue_line("markers", "slow: in the slow tier, run by --slow (CI runs it after the default suite)")


def pytest_report_header(config):
    if config.getoption("--slow"):
        return "tier: slow (the tests marked slow; pytest without --slow runs the rest)"
    return "tier: default (the tests marked slow are deselected: pytest --slow runs them; CI runs both)"


def in_tier(item, slow: bool, named: list[str]) -> bool:
    """Whether ``item`` runs in this tier: its slow mark says which; a test named on the command line by its id
    (``tests/test_x.py::test_y``) runs in either, as asked."""
    if any(item.nodeid == n or item.nodeid.startswith(n + "[") or item.nodeid.startswith(n + "::") for n in named):
        return True
    return (item.get_closest_marker("slow") is not None) == slow


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups into the tests' ids
def pytest_collection_modifyitems(config, items):
    named = [os.path.relpath(a.split("::")[0], config.rootpath) + "::" + a.split("::", 1)[1]
             for a in config.args if "::" in a]  # fmt: skip
    chosen = [item for item in items if in_tier(item, config.getoption("--slow"), named)]
    if len(chosen) < len(items):
        kept = set(map(id, chosen))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = chosen
    for item in items:  # pytest -n: the tests of one SLURM cluster share a worker
        if "slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))
    if config.getoption("--deep"):
        return  # there each flex cell compiles graphs of its own: spread over the workers, not grouped
    for item in items:
        # The default run's flex tests share a handful of compiled graphs (a head shape and score
        # modification each; about 10 s of CPU per graph and process): on one worker, each is compiled once.
        if "flex" in item.name and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("flex"))
    skip = pytest.mark.skip(reason="part of the deep sweep: pytest --deep")
    for item in items:
        if "deep" in item.keywords:
            item.add_marker(skip)
