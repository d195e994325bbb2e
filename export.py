"""Export a checkpoint to the Hugging Face GPT-2 format: ``python export.py source=<run dir | .pt> out=<folder>``.

    python export.py source=runs/2026-11-21/10-00-00_wrapper-manual out=exported/
    python -c "from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('exported')"

Any layout exports (weights are converted to GPT-2's fused form). The folder gets
``config.json`` and ``model.safetensors`` (what ``GPT2LMHeadModel.from_pretrained``
reads), ``headlab.json`` (the tokenizer and where the weights came from) and, for
the ``gpt2``/``r50k_base`` tokenizers, GPT-2's tokenizer files (``vocab.json``,
``merges.txt``) so ``AutoTokenizer.from_pretrained(folder)`` works too.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from cli import check_choice, check_overrides, user_errors
from data.hf_tokenizer import write_hf_gpt2_tokenizer
from data.tokenizers import GPT2_IDS
from model import load_model
from model.checkpoint import BEST, LAST
from model.gpt2_export import check_gpt2_holds, export_hf_gpt2


@dataclass
class ExportConfig:
    source: str = MISSING  # a run directory or a checkpoint file
    out: str = MISSING  # the folder to write (created; files in it are replaced)
    checkpoint: str = LAST  # which checkpoint of a run directory: last.pt | best.pt


ConfigStore.instance().store(name="export_schema", node=ExportConfig)
USAGE = "python export.py source=<run dir | checkpoint.pt> out=<folder> [checkpoint=best.pt]"

BYTES_HOW_TO = (
    "token ids are the text's UTF-8 bytes (0-255) and 256 is <|endoftext|>: ids = list(text.encode('utf-8')); "
    "text = bytes(i for i in ids if i < 256).decode('utf-8', 'replace')"
)


def run(cfg: ExportConfig) -> Path:
    check_choice("checkpoint", cfg.checkpoint, (BEST, LAST))
    if Path(cfg.out).expanduser().is_file():
        raise ValueError(f"out={cfg.out!r} is a file; give a folder (created if missing)")
    loaded = load_model(cfg.source, checkpoint=cfg.checkpoint)
    if loaded.path is None:
        raise ValueError(f"source={cfg.source!r} is already in the Hugging Face format: nothing to export")
    check_gpt2_holds(loaded.model.config)  # before anything is written
    out = Path(cfg.out).expanduser()
    tokenizer = loaded.tokenizer
    written = export_hf_gpt2(loaded.model, out, tokenizer.eot_id)
    readable_as_the_umask_allows(out / "model.safetensors")
    trained = loaded.model.config
    info = {"tokenizer": tokenizer.name, "eot_id": tokenizer.eot_id, "source": str(loaded.path), "step": loaded.step,
            "trained_attention": trained.attention, "trained_kernel": trained.kernel}  # fmt: skip
    if tokenizer.name in GPT2_IDS:
        written += write_hf_gpt2_tokenizer(tokenizer, out, loaded.model.config.block_size)
        info["tokenize"] = "AutoTokenizer.from_pretrained(this folder): GPT-2's tokenizer, the same ids as tiktoken's"
    elif tokenizer.name == "bytes":
        info["tokenize"] = BYTES_HOW_TO
    else:
        info["tokenize"] = f"tiktoken.get_encoding({tokenizer.name!r}); its ids are not GPT-2's, so no GPT-2 files"
    (out / "headlab.json").write_text(json.dumps(info, indent=2) + "\n")
    written.append(out / "headlab.json")
    shared = trained.kv_heads != trained.n_head  # GPT-2 has one key/value head per query head
    size = f"{loaded.model.num_params():,} parameters" + (
        f"; {trained.kv_heads} key/value heads written as {trained.n_head}, the same function" if shared else "")
    print(f"exported {loaded.name} ({size}, tokenizer {tokenizer.name}) "
          f"to {out}/: {', '.join(p.name for p in written)}", file=sys.stderr)  # fmt: skip
    print(f"tokenize: {info['tokenize']}", file=sys.stderr)
    return out


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
