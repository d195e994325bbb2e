"""Nothing shared, nothing lost, every bad input a clear error naming the value and the fix."""

from __future__ import annotations

import errno
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import DEAD_PID, TINY, compose_train, read_metrics, tiny_gpt_config

import compare
import evaluate
import export
import heads
import sample
from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare
from measuring import bench_command
from model import GPT, Checkpoint
from model.checkpoints.checkpoint import load_checkpoint
from training.loop import train
from training.run_log import claim_run_dir

# --------------------------------------------------------------- run directories


def test_two_runs_claiming_one_directory_at_the_same_moment_the_second_is_refused(tmp_path):
    claim_run_dir(str(tmp_path / "run"))  # the first run has written nothing yet
    with pytest.raises(ValueError, match=r"already holds another run .* trainer.resume="):
        claim_run_dir(str(tmp_path / "run"))


def test_the_second_of_two_resume_auto_commands_on_one_fresh_directory_is_told_to_wait_not_to_add_resume_auto(
        tmp_path, data_cache):  # fmt: skip
    held = claim_run_dir(str(tmp_path / "run"))  # the other command: it found the directory empty a moment before
    try:
        with pytest.raises(ValueError) as refused:
            train(compose_train(*TINY, "logger=none", "trainer.max_steps=2", "trainer.resume=auto",
                                f"trainer.run_dir={tmp_path / 'run'}", f"data.cache_dir={data_cache}"))  # fmt: skip
    finally:
        held.release()
    message = str(refused.value)
    assert "was empty when this command's trainer.resume=auto looked, and another process has started" in message
    assert "Run it again once the other has ended" in message and "add trainer.resume=auto" not in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists(), "this one wrote nothing"


def test_stray_temporary_checkpoints_of_a_killed_run_are_removed_when_it_is_resumed(tmp_path, data_cache):
    run = tmp_path / "run"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=6", "trainer.stop_at_step=3",
                        f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))  # fmt: skip
    stray = run / f".last.pt.tmp-{DEAD_PID}"  # a save cut by SIGKILL (no process has that pid)
    stray.write_bytes(b"\0" * 1000)
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=6", f"trainer.resume={run}",
                        f"trainer.run_dir={tmp_path / 'more'}", f"data.cache_dir={data_cache}"))  # fmt: skip
    assert not stray.exists()


def test_a_full_disk_during_a_save_names_the_path_removes_the_temporary_and_keeps_the_old_checkpoint(
    tmp_path, monkeypatch
):
    model = GPT(tiny_gpt_config())
    ckpt = Checkpoint(model=model.state_dict(), model_config=asdict(model.config), tokenizer="bytes", step=1)
    ckpt.save(tmp_path / "last.pt")

    def disk_full(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    ckpt.step = 2
    with pytest.raises(OSError, match=r"could not write checkpoint .*last.pt \(OSError: .*No space left.*free disk"):
        ckpt.save(tmp_path / "last.pt")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"], "no temporary file left"
    assert load_checkpoint(tmp_path).step == 1, "the previous checkpoint is intact"


# --------------------------------------------------------------- data files and prepared data


def files_cfg(tmp_path: Path, folder: Path, **fields) -> DataConfig:
    return DataConfig(**{"name": "bad", "source": "files", "path": str(folder), "tokenizer": "bytes", "num_proc": 1,
                         "cache_dir": str(tmp_path / "cache"), **fields})  # fmt: skip


def folder_with(tmp_path: Path, name: str, content: bytes, good: int = 20) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir(exist_ok=True)
    suffix = Path(name).suffix
    for i in range(good):
        (folder / f"good_{i}{suffix}").write_text(f"good document {i}\n" * 5)
    (folder / name).write_bytes(content)
    return folder


PNG_BYTES = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01"


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("latin1.txt", "caf\xe9 au lait\n".encode("latin-1"), r"latin1.txt is not UTF-8 text \(line 1, byte 3"),
        ("program.txt", b"\x7fELF\x02\x01\x01\x00\x00\x00", r"program.txt is binary \(a NUL byte at offset 7\)"),
        ("picture.png", PNG_BYTES, r"picture.png is binary"),
    ],
)
def test_a_bad_text_file_is_named_with_the_fix(tmp_path, name, content, message):
    with pytest.raises(ValueError, match=message):
        prepare(files_cfg(tmp_path, folder_with(tmp_path, name, content)))


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"text": "one"}\n{"text": "two"}\n{"text": "thr',
         r"line 3 is not valid JSON \(the file may be cut mid-line\)"),
        ('{"text": "one"}\n{"text": 42}\n', r"line 2: 'text' holds int '42', not text"),
    ],
    ids=["cut-mid-line", "text-not-a-string"],
)
def test_a_bad_jsonl_line_is_named(tmp_path, content, message):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "docs.jsonl").write_text(content)
    with pytest.raises(ValueError, match=f"docs.jsonl {message}"):
        prepare(files_cfg(tmp_path, folder))


@pytest.mark.parametrize(
    "values,message",
    [([1, 2, 3], r"column 'text' is int64, not text"),
     (["a", None, "c"], r"column 'text' has 1 null value\(s\) \(first at row 1\)")],
)
def test_a_parquet_text_column_of_numbers_or_nulls_is_named(tmp_path, values, message):
    folder = tmp_path / "corpus"
    folder.mkdir()
    pq.write_table(pa.table({"text": values}), folder / "docs.parquet")
    with pytest.raises(ValueError, match=f"docs.parquet: {message}"):
        prepare(files_cfg(tmp_path, folder))


def prepared(tmp_path: Path) -> PreparedData:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(20):
        (folder / f"{i}.txt").write_text(f"document {i}\n" * 20)
    return PreparedData(prepare(files_cfg(tmp_path, folder)))


def test_an_empty_meta_json_is_named_with_delete_to_rebuild(tmp_path):
    data = prepared(tmp_path)
    (data.folder / "meta.json").write_text("")
    with pytest.raises(ValueError, match=r"meta.json is damaged \(JSONDecodeError.*delete .* to prepare it again"):
        PreparedData(data.folder)


def test_random_bytes_in_val_bin_are_found_when_the_data_is_opened(tmp_path):
    data = prepared(tmp_path)
    val = data.folder / "val.bin"
    rng = np.random.default_rng(0)
    val.write_bytes(rng.integers(0, 2**16, size=val.stat().st_size // 2, dtype=np.uint16).tobytes())
    with pytest.raises(ValueError, match=r"val.bin holds token id \d+, outside the vocabulary of 257.*delete"):
        PreparedData(data.folder)


# --------------------------------------------------------------- compare


def test_compare_skips_a_damaged_run_with_a_warning_and_reports_the_rest(tmp_path, data_cache, capsys):
    sweep = tmp_path / "sweep"
    for name in ("a", "b", "c"):
        train(compose_train(*TINY, "logger=none", "trainer.max_steps=10", f"trainer.run_dir={sweep / name}",
                            f"data.cache_dir={data_cache}"))  # fmt: skip
    (sweep / "b" / "run.json").write_text((sweep / "b" / "run.json").read_text()[:50])  # truncated
    with open(sweep / "c" / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "train/lo')  # cut mid-line by a kill
    out = compare.main([str(sweep)])
    err = capsys.readouterr().err
    assert "skipped" in err and str(sweep / "b") in err and "metrics.jsonl:" in err
    rows = (out / "report.csv").read_text().splitlines()[1:]
    assert [Path(r.split(",")[0]).name for r in rows] == ["a", "c"]


# --------------------------------------------------------------- untrusted checkpoints


def test_a_checkpoint_chooses_no_paths_or_urls(trained_run, tmp_path, data_cache):
    ckpt = load_checkpoint(trained_run)
    trap = tmp_path / "chosen-by-the-checkpoint"
    # A ".invalid" host never resolves: even a regression could not send traffic anywhere.
    evil = {"name": "evil", "source": "url", "url": "http://checkpoint.invalid/x", "path": str(trap / "x"),
            "cache_dir": str(trap)}
    ckpt.train_config = {**ckpt.train_config, "data": evil}
    ckpt.save(tmp_path / "crafted.pt")
    data = DataConfig(cache_dir=str(data_cache))
    heads.run(heads.HeadsConfig(source=str(tmp_path / "crafted.pt"), data=data, windows=2, device="cpu",
                                out=str(tmp_path / "heads")))  # fmt: skip
    evaluate.run(evaluate.EvaluateConfig(source=str(tmp_path / "crafted.pt"), data=data, device="cpu",
                                         out=str(tmp_path / "eval.json")))  # fmt: skip
    assert not trap.exists(), "nothing was read or written where the checkpoint pointed"


# --------------------------------------------------------------- options of the secondary tools


def sample_cfg(run, **f):
    return sample.SampleConfig(**{"source": str(run), "max_new_tokens": 2, "device": "cpu", **f})


def heads_cfg(run, cache, **f):
    return heads.HeadsConfig(**{"source": str(run), "windows": 2, "device": "cpu",
                                "data": DataConfig(cache_dir=str(cache)), **f})  # fmt: skip


def evaluate_cfg(run, cache, **f):
    return evaluate.EvaluateConfig(**{"source": str(run), "device": "cpu", "data": DataConfig(cache_dir=str(cache)),
                                      **f})  # fmt: skip


SAMPLE = [
    ("num_samples", 0), ("num_samples", -3), ("max_new_tokens", -1), ("temperature", -0.5),
    ("temperature", float("nan")), ("top_k", 0), ("top_k", -10), ("top_p", 0.0), ("top_p", 1.5), ("seed", -1),
    ("device", "gpu"), ("device", "cuda:x"), ("dtype", "fp8"), ("dtype", "half"), ("attention", "fused"),
    ("kernel", "flash"), ("prompt_file", "/nonexistent/prompt.txt"), ("past_context", "fulll"),
]  # fmt: skip
HEADS = [
    ("windows", 0), ("windows", 100000), ("map_tokens", 0), ("map_tokens", -5), ("layer", -1), ("head", -2),
    ("layer", 7), ("head", 9), ("checkpoint", "middle.pt"), ("device", "tpu"), ("attention", "fused"),
    ("kernel", "xformers"),
]  # fmt: skip
EVALUATE = [
    ("windows", 0), ("batch_size", 0), ("checkpoint", "other.pt"), ("device", "mps0"), ("dtype", "int8"),
    ("attention", "multi"), ("kernel", "triton"), ("lengths", [0]), ("lengths", ["3y"]), ("lengths", []),
    ("lengths", ["0x"]), ("lengths", [1.5]), ("lengths", [64]), ("protocol", "strided"), ("stride", 0),
    ("past_context", "infinite"), ("rope_scaling", "yarm"), ("rope_scaling", "pi"), ("rope_factor", 2.0),
    ("retrieval", "needle"), ("retrieval", "passkey"), ("depths", [1.5]), ("depths", []), ("depths", ["deep"]),
    ("examples", 0),
]  # fmt: skip
BENCH = [
    ("--seq-len", "0"), ("--batch", "0"), ("--n-head", "0"), ("--n-embd", "0"), ("--n-layer", "0"),
    ("--vocab-size", "0"), ("--repeats", "0"), ("--min-run-time", "0"), ("--device", "gpu"), ("--layouts", "fused"),
    ("--kernels", "flash"), ("--compile", "jit"),
]  # fmt: skip


def one_line_naming(message: str, option: str) -> None:
    assert "\n" not in message.strip(), message
    assert option.lstrip("-") in message, (option, message)


@pytest.mark.parametrize("option,value", SAMPLE)
def test_a_bad_sample_option_is_one_line_naming_it(trained_run, option, value):
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        sample.run(sample_cfg(trained_run, **{option: value}))
    one_line_naming(str(err.value), f"{option}=")


@pytest.mark.parametrize("option,value", HEADS)
def test_a_bad_heads_option_is_one_line_naming_it(trained_run, data_cache, option, value):
    with pytest.raises(ValueError) as err:
        heads.run(heads_cfg(trained_run, data_cache, **{option: value}))
    one_line_naming(str(err.value), f"{option}=")


@pytest.mark.parametrize("option,value", EVALUATE)
def test_a_bad_evaluate_option_is_one_line_naming_it(trained_run, data_cache, option, value):
    with pytest.raises(ValueError) as err:
        evaluate.run(evaluate_cfg(trained_run, data_cache, **{option: value}))
    one_line_naming(str(err.value), f"{option}=")


@pytest.mark.parametrize("option,value", BENCH)
def test_a_bad_bench_option_is_one_line_naming_it(option, value, capsys):
    with pytest.raises(SystemExit):
        bench_command.parse_args([option, value])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    one_line_naming(last, option)


def test_bad_export_and_compare_options_are_one_line_naming_them(trained_run, tmp_path):
    (tmp_path / "a-file").write_text("")
    for cfg, option in ((export.ExportConfig(source=str(trained_run), out=str(tmp_path / "a-file")), "out="),
                        (export.ExportConfig(source=str(trained_run), out=str(tmp_path), checkpoint="x.pt"),
                         "checkpoint=")):  # fmt: skip
        with pytest.raises(ValueError) as err:
            export.run(cfg)
        one_line_naming(str(err.value), option)
    for argv, option in (([str(trained_run), "--target-loss", "-1"], "--target-loss"),
                         ([str(trained_run), "--out", str(tmp_path / "a-file")], "--out"),
                         ([str(tmp_path / "nowhere")], "nowhere")):  # fmt: skip
        with pytest.raises((ValueError, FileNotFoundError)) as err:
            compare.main(argv)
        one_line_naming(str(err.value), option)


def test_the_table_covers_at_least_40_bad_options():
    assert len(SAMPLE) + len(HEADS) + len(EVALUATE) + len(BENCH) + 5 >= 40


def test_a_negative_seed_is_refused_before_data_preparation(tmp_path):
    cfg = compose_train(*TINY, "trainer.seed=-1", f"trainer.run_dir={tmp_path / 'run'}",
                        f"data.cache_dir={tmp_path / 'cache'}")  # fmt: skip
    with pytest.raises(ValueError, match=r"trainer.seed=-1 must be >= 0"):
        train(cfg)
    assert not (tmp_path / "cache").exists()


def test_an_interrupted_run_says_so_in_its_summary(tmp_path, data_cache):
    summary = train(compose_train(*TINY, "logger=none", "trainer.max_steps=8", "trainer.stop_at_step=3",
                                  f"trainer.run_dir={tmp_path / 'run'}", f"data.cache_dir={data_cache}"))  # fmt: skip
    assert summary["step"] == 3
    assert [m["step"] for m in read_metrics(tmp_path / "run") if "train/loss" in m] == [1, 2, 3]
