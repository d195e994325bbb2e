"""Text sources -> a HF `datasets` dataset with one document per row in a ``text`` column.

Every source goes through `datasets`: the embedded Python standard library and
local text files through the ``text`` builder (line breaks kept), parquet and
jsonl through their builders, a URL through a cached download, the hub by
name (optionally streaming), and the retrieval tasks as generated documents.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from data.config import DataConfig, data_cache_dir

if TYPE_CHECKING:
    import datasets

# Folders of the standard library that are not the library itself.
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "__pycache__", "idlelib"}
_BUILDER_BY_SUFFIX = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


def stdlib_files() -> list[str]:
    """The running interpreter's standard-library .py files, in a fixed (sorted) order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP)
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return files


def resolve_files(path: str) -> list[str]:
    """A file, a directory (all files below it) or a glob -> sorted list of files."""
    expanded = os.path.expanduser(path)
    if os.path.isfile(expanded):
        return [expanded]
    if os.path.isdir(expanded):
        found = [str(p) for p in Path(expanded).rglob("*") if p.is_file() and not p.name.startswith(".")]
    else:
        found = [p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p)]
    if not found:
        where = "" if os.path.isabs(expanded) else f" (looked in {os.path.abspath(expanded)})"
        raise FileNotFoundError(
            f"data.path={path!r} matches no file{where}; give an existing file, directory or glob "
            f"(e.g. 'texts/**/*.txt')"
        )
    return sorted(found)


def check_source(cfg: DataConfig) -> None:
    """Refuse local files that are not there, before a tokenizer (which may need the network) is loaded."""
    if cfg.source == "files":
        resolve_files(cfg.path)


def load_documents(cfg: DataConfig) -> datasets.Dataset | datasets.IterableDataset:
    """The documents of a source, as a dataset with a ``text`` column."""
    if cfg.source == "pystdlib":
        ds = _load_files(stdlib_files(), cfg)
    elif cfg.source == "files":
        ds = _load_files(resolve_files(cfg.path), cfg)
    elif cfg.source == "url":
        ds = _load_files([download(cfg.url, data_cache_dir(cfg))], cfg)
    elif cfg.source == "retrieval":
        import datasets

        from data.retrieval import corpus

        ds = datasets.Dataset.from_dict({"text": corpus()})
    else:
        ds = _load_hub(cfg)
    return _only_text(ds, cfg.text_column)


def source_identity(cfg: DataConfig) -> dict:
    """What the prepared tokens depend on, beyond the settings: the files' sizes and times."""
    if cfg.source == "pystdlib":
        files = stdlib_files()
    elif cfg.source == "files":
        files = resolve_files(cfg.path)
    elif cfg.source == "hub" and os.path.isdir(os.path.expanduser(cfg.path)):
        files = resolve_files(cfg.path)
    elif cfg.source == "retrieval":
        from data.retrieval import CORPUS_VERSION

        return {"generator": CORPUS_VERSION}  # generated: the same documents until the generator changes
    else:
        return {}  # a URL is downloaded once; a hub dataset is named by its id
    stats = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    return {"files": len(files), "stat_digest": hashlib.sha256(repr(stats).encode()).hexdigest()}


def _load_files(files: list[str], cfg: DataConfig) -> datasets.Dataset:
    suffixes = {Path(f).suffix.lower() for f in files}
    builders = {_BUILDER_BY_SUFFIX.get(s, "text") for s in suffixes}
    if len(builders) > 1:
        raise ValueError(
            f"data.path mixes file kinds {sorted(suffixes)}; point it at one kind (text, parquet or jsonl)"
        )
    builder = builders.pop()
    check_files(files, builder, cfg.text_column)
    kwargs = {"sample_by": cfg.sample_by, "keep_linebreaks": True} if builder == "text" else {}
    import datasets  # imported when data is prepared, not by every command that starts

    return datasets.load_dataset(builder, data_files=files, split="train", **kwargs)


def check_files(files: list[str], builder: str, column: str) -> None:
    """Refuse a file `datasets` would choke on, naming the file, the line or row, and the fix."""
    for path in files:
        if builder == "text":
            _check_text(path)
        elif builder == "parquet":
            _check_parquet(path, column)
        elif path.endswith(".jsonl"):
            _check_jsonl(path, column)


def _check_text(path: str) -> None:
    data = Path(path).read_bytes()
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ValueError(
            f"data file {path} is binary (a NUL byte at offset {nul}), not text; remove it from "
            f"data.path or narrow the pattern (e.g. data.path='texts/**/*.txt')"
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"data file {path} is not UTF-8 text (line {line}, byte {err.start}: {data[err.start:err.start + 4]!r}); "
            f"convert it (e.g. iconv -f latin1 -t utf-8) or leave it out of data.path"
        ) from None


def _check_jsonl(path: str, column: str) -> None:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                cut = " (the file may be cut mid-line)" if not raw.endswith(b"\n") else ""
                raise ValueError(
                    f"data file {path} line {number} is not valid JSON{cut}: {err}; fix or remove that line"
                ) from None
            _check_text_value(row.get(column, _MISSING) if isinstance(row, dict) else _MISSING,
                              f"data file {path} line {number}", column, row)  # fmt: skip


_MISSING = object()


def _check_text_value(value, where: str, column: str, row=None) -> None:
    if value is _MISSING:
        keys = sorted(row) if isinstance(row, dict) else type(row).__name__
        raise ValueError(f"{where} has no {column!r} (it has {keys}); set data.text_column to the text's key")
    if not isinstance(value, str):
        raise ValueError(
            f"{where}: {column!r} holds {type(value).__name__} {str(value)[:40]!r}, not text; set data.text_column "
            f"to the column with the documents, or drop the rows without text"
        )


def _check_parquet(path: str, column: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"data file {path} is not a readable parquet file ({err}); remove or replace it") from None
    if column not in schema.names:
        return  # named with all the columns of the dataset, after loading
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(
            f"data file {path}: column {column!r} is {kind}, not text; set data.text_column to the column with the "
            f"documents (it has {schema.names})"
        )
    values = pq.read_table(path, columns=[column]).column(column)
    if values.null_count:
        first = next(i for i, v in enumerate(values.is_null().to_pylist()) if v)
        raise ValueError(
            f"data file {path}: column {column!r} has {values.null_count} null value(s) (first at row {first}); "
            f"drop or fill those rows"
        )


def _load_hub(cfg: DataConfig) -> datasets.Dataset | datasets.IterableDataset:
    try:
        import datasets

        return datasets.load_dataset(cfg.path, cfg.subset, split=cfg.split, streaming=cfg.streaming)
    except (ConnectionError, OSError) as err:
        raise RuntimeError(
            f"could not load hub dataset {cfg.path!r} (subset {cfg.subset!r}, split {cfg.split!r}): "
            f"{type(err).__name__}: {str(err)[:300]}. It needs the network the first time (and "
            f"HF_HUB_OFFLINE unset); offline, use a machine that has it cached, a local copy "
            f"(data.source=files data.path=...), or the embedded corpus (data=pystdlib)"
        ) from err


def _only_text(ds, column: str):
    columns = ds.column_names
    if columns is not None and column not in columns:
        raise ValueError(f"the dataset has no column {column!r} (it has {columns}); set data.text_column")
    if column != "text":
        ds = ds.rename_column(column, "text")
    extra = [c for c in (ds.column_names or []) if c != "text"]
    return ds.remove_columns(extra) if extra else ds


class DownloadFailed(RuntimeError):
    """A URL's text could not be downloaded (offline): ``url``, and why (``reason``)."""

    def __init__(self, url: str, reason: str) -> None:
        self.url, self.reason = url, reason
        super().__init__(f"could not download data.url={url!r} ({reason}); check the network, or download the file "
                         f"yourself and use data.source=files data.path=<the file>")  # fmt: skip


def fetch_source(cfg: DataConfig) -> None:
    """Download what the source reads from the network and is not in the cache yet: a URL's text (kept, so that
    preparing reads it there)."""
    if cfg.source == "url":
        download(cfg.url, data_cache_dir(cfg))


def download(url: str, cache_dir: Path) -> str:
    """Fetch a URL once into ``cache_dir/downloads`` (atomically); later calls reuse the file."""
    folder = cache_dir / "downloads"
    name = Path(urllib.parse.urlparse(url).path).name or "download.txt"
    target = folder / f"{hashlib.sha256(url.encode()).hexdigest()[:12]}-{name}"
    if target.exists():
        return str(target)
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".part-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {name}") as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as err:
        partial.unlink(missing_ok=True)
        raise DownloadFailed(url, str(err)) from err
    os.replace(partial, target)
    return str(target)
