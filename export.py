"""Export a checkpoint to the Hugging Face GPT-2 format: ``python export.py source=<run dir | .pt> out=<folder>``.

    python export.py source=runs/2026-11-21/10-00-00_wrapper-manual out=exported/
    python -c "from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('exported')"

Any layout exports (weights are converted to GPT-2's fused form). The folder gets
``config.json`` and ``model.safetensors`` (what ``GPT2LMHeadModel.from_pretrained``
reads), ``headlab.json`` (the tokenizer and where the weights came from) and, for
the ``gpt2``/``r50k_base`` tokenizers, GPT-2's tokenizer files (``vocab.json``,
``merges.txt``) so ``AutoTokenizer.from_pretrained(folder)`` works too.

``out`` is new, empty, or an earlier export's folder. The files are written into a
temporary folder beside it, then each is renamed into place, and the files an earlier
export wrote that this one does not (e.g. GPT-2's tokenizer files, after a model with
another tokenizer) are removed: the folder holds exactly this export. Files export.py
never writes (an evaluation's ``eval-*.json``, a README) are kept, and named.
"""

from __future__ import annotations

from common.startup import guard_start_up, start_up_over

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from cli import check_choice, check_overrides, user_errors
from common.run_files import TMP_MARK, read_json, remove_leftovers, temporary_name
from data.hf_tokenizer import HF_GPT2_TOKENIZER_FILES, write_hf_gpt2_tokenizer
from data.tokenizers import GPT2_IDS
from model import load_model
from model.checkpoints.checkpoint import BEST, LAST
from model.checkpoints.gpt2_export import HF_CONFIG, HF_WEIGHTS, check_gpt2_holds, export_hf_gpt2, repeated_heads


@dataclass
class ExportConfig:
    source: str = MISSING  # a run directory or a checkpoint file
    out: str = MISSING  # the folder to write: new, empty, or an earlier export's (replaced by this one)
    checkpoint: str = LAST  # which checkpoint of a run directory: last.pt | best.pt


ConfigStore.instance().store(name="export_schema", node=ExportConfig)
USAGE = "python export.py source=<run dir | checkpoint.pt> out=<folder> [checkpoint=best.pt]"

HEADLAB_INFO = "headlab.json"
# Every name export.py writes: in an earlier export's folder, these are the files it may replace or remove.
EXPORT_FILES = frozenset({HF_CONFIG, HF_WEIGHTS, HEADLAB_INFO, *HF_GPT2_TOKENIZER_FILES})

BYTES_HOW_TO = (
    "token ids are the text's UTF-8 bytes (0-255) and 256 is <|endoftext|>: ids = list(text.encode('utf-8')); "
    "text = bytes(i for i in ids if i < 256).decode('utf-8', 'replace')"
)


def run(cfg: ExportConfig) -> Path:
    check_choice("checkpoint", cfg.checkpoint, (BEST, LAST))
    out = Path(cfg.out).expanduser()
    if out.is_file():
        raise ValueError(f"out={cfg.out!r} is a file; give a folder (created if missing)")
    check_out_folder(out)
    loaded = load_model(cfg.source, checkpoint=cfg.checkpoint, offer_pretrained=False)  # GPT-2's is exported already
    if loaded.path is None:
        raise ValueError(f"source={cfg.source!r} is already in the Hugging Face format: nothing to export")
    check_gpt2_holds(loaded.model.config)  # before anything is written
    start_up_over()  # the writing begins
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(out.parent, f".{out.name}{TMP_MARK}*")  # the staging folders of killed exports
    staged = temporary_name(out)
    try:
        info = write_export(loaded, staged)
        removed, kept = replace_export(out, staged)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    trained = loaded.model.config
    shared = repeated_heads(trained)  # GPT-2 has one key/value head per query head, in every layer
    size = f"{loaded.model.num_params():,} parameters" + (
        f"; {' and '.join(shared)} key/value heads written as {trained.n_head}, the same function" if shared else "")
    print(f"exported {loaded.name} ({size}, tokenizer {info['tokenizer']}) "
          f"to {out}/: {', '.join(info['files'])}", file=sys.stderr)  # fmt: skip
    if removed:
        print(f"removed the earlier export's {', '.join(removed)} (this export has none)", file=sys.stderr)
    if kept:
        print(f"kept {', '.join(kept)}: not written by export.py", file=sys.stderr)
    print(f"tokenize: {info['tokenize']}", file=sys.stderr)
    return out


def check_out_folder(out: Path) -> None:
    """``out`` must be new, empty or an earlier export's folder: export.py never removes what it did not write,
    and does not mix its files into another model's folder."""
    if not out.is_dir() or not any(out.iterdir()):
        return
    info = read_json(out / HEADLAB_INFO)
    if not (isinstance(info, dict) and "source" in info and "tokenize" in info):
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise ValueError(
            f"out={out} is not empty ({shown}) and holds no earlier export ({HEADLAB_INFO}); give a new or empty "
            f"folder, or the folder of an earlier export to replace it"
        )


def write_export(loaded, folder: Path) -> dict:
    """The export's files in ``folder``; returns headlab.json's content (``files``: every file written)."""
    tokenizer, trained = loaded.tokenizer, loaded.model.config
    written = export_hf_gpt2(loaded.model, folder, tokenizer.eot_id)
    readable_as_the_umask_allows(folder / HF_WEIGHTS)
    info = {"tokenizer": tokenizer.name, "eot_id": tokenizer.eot_id, "source": str(loaded.path), "step": loaded.step,
            "trained_attention": trained.attention, "trained_kernel": trained.kernel}  # fmt: skip
    if tokenizer.name in GPT2_IDS:
        written += write_hf_gpt2_tokenizer(tokenizer, folder, trained.block_size)
        info["tokenize"] = "AutoTokenizer.from_pretrained(this folder): GPT-2's tokenizer, the same ids as tiktoken's"
    elif tokenizer.name == "bytes":
        info["tokenize"] = BYTES_HOW_TO
    else:
        info["tokenize"] = f"tiktoken.get_encoding({tokenizer.name!r}); its ids are not GPT-2's, so no GPT-2 files"
    info["files"] = [p.name for p in written] + [HEADLAB_INFO]
    (folder / HEADLAB_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


def replace_export(out: Path, staged: Path) -> tuple[list[str], list[str]]:
    """Rename each file of ``staged`` into ``out`` (headlab.json last: it says the export is whole), then remove
    the files of an earlier export that this one does not have. Returns (removed, kept: files not export.py's)."""
    out.mkdir(exist_ok=True)
    new = sorted(p.name for p in staged.iterdir())
    for name in sorted(new, key=lambda name: name == HEADLAB_INFO):
        os.replace(staged / name, out / name)
    removed = sorted(p.name for p in out.iterdir() if p.name in EXPORT_FILES and p.name not in new)
    for name in removed:
        (out / name).unlink()
    kept = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_FILES)
    return removed, kept


def readable_as_the_umask_allows(path: Path) -> None:
    """safetensors writes through a private temporary file (mode 0600); the folder's other files get the usual
    0666 less the umask (0644), and a folder shared with others or uploaded must be readable the same way."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


@hydra.main(version_base="1.3", config_path="configs", config_name="export")
def main(cfg: DictConfig) -> None:
    with user_errors(USAGE):
        run(OmegaConf.to_object(cfg))


if __name__ == "__main__":
    check_overrides("export", "python export.py")
    main()
