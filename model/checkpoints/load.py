"""One loader for every script: any source -> (model in the requested layout/kernel, tokenizer, facts).

A source is a run directory (its ``last.pt``, or the checkpoint named), a
checkpoint file, a pretrained GPT-2 name on the Hugging Face hub (``gpt2``,
``gpt2-medium``, ...) or a local folder written by ``save_pretrained``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from model import registry
from model.checkpoints.checkpoint import BEST, LAST, Checkpoint, checkpoint_path, load_checkpoint
from model.checkpoints.convert import check_converts
from model.checkpoints.pretrained import CONFIG, HUB_GPT2, WEIGHTS, held, is_pretrained_source, load_pretrained_gpt2
from model.config import GPTConfig, where_set
from model.gpt import GPT


@dataclass
class LoadedModel:
    model: GPT
    tokenizer: object  # data.tokenizers.Tokenizer
    source: str
    path: Path | None = None  # the checkpoint file read, for checkpoints
    step: int | None = None  # training steps behind the weights, for checkpoints
    checkpoint: Checkpoint | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """A short label: ``<run or model>`` plus the checkpoint and step where known."""
        if self.path is None:
            return Path(self.source).name or self.source
        label = self.path.parent.name if self.path.name in (LAST, BEST) else self.path.stem
        return f"{label}/{self.path.name}, step {self.step}"


def load_model(
    source: str,
    attention: str | None = None,
    kernel: str | None = None,
    checkpoint: str = LAST,
    dropout: float | None = None,
    offer_pretrained: bool = True,
) -> LoadedModel:
    """Load ``source`` on the CPU; ``attention``/``kernel`` convert the weights to another layout/kernel,
    ``checkpoint`` picks the file in a run directory (``last.pt`` or ``best.pt``). A source that is not there names
    every kind of source the script takes (``offer_pretrained``: GPT-2's names and Hugging Face folders too)."""
    from data.tokenizers import get_tokenizer

    if is_pretrained_source(source):
        if attention is not None:
            check_converts(registry.canonical_layout(), attention)  # GPT-2's weights are in the canonical layout
        model = load_pretrained_gpt2(source, attention or GPTConfig.attention, kernel or GPTConfig.kernel)
        return LoadedModel(model, get_tokenizer(exported_tokenizer(source) or "gpt2"), source)
    try:
        path = checkpoint_path(source, checkpoint)
    except FileNotFoundError:
        raise FileNotFoundError(no_source(source, checkpoint, offer_pretrained)) from None
    ckpt = load_checkpoint(path)
    return LoadedModel(model_from_checkpoint(ckpt, attention, kernel, dropout), get_tokenizer(ckpt.tokenizer),
                       source, path, ckpt.step, ckpt)  # fmt: skip


def no_source(source: str, checkpoint: str = LAST, offer_pretrained: bool = True) -> str:
    """Why ``source`` loads nothing, and every kind of source a script takes (``offer_pretrained``: GPT-2's names
    and Hugging Face folders too)."""
    folder = Path(source).expanduser()
    holds = f" (a folder holding {held(folder)})" if folder.is_dir() else ""
    kinds = [f"a run directory holding {checkpoint}", "a checkpoint file (.pt)"]
    if offer_pretrained:
        kinds += [f"a GPT-2 name ({', '.join(HUB_GPT2)}: from the Hugging Face hub, or its cache offline)",
                  f"a Hugging Face folder ({CONFIG} and {WEIGHTS}, as save_pretrained or export.py writes them)"]
    return f"no checkpoint at {source!r}{holds}: give {', '.join(kinds[:-1])} or {kinds[-1]}"


def exported_tokenizer(source: str) -> str | None:
    """The tokenizer a folder written by export.py names in its headlab.json (a hub name or a plain
    transformers folder has none: GPT-2's)."""
    info = Path(source).expanduser() / "headlab.json"
    if not info.is_file():
        return None
    try:
        return json.loads(info.read_text())["tokenizer"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{info} names no tokenizer ({type(err).__name__}: {err}); export the folder again with "
                         f"export.py, or remove {info.name} to read it with GPT-2's tokenizer") from None  # fmt: skip


def check_holds(config: GPTConfig, attention: str) -> None:
    """Refuse converting a checkpoint to a layout that does not apply an option its model sets (differential
    attention to the wrapper), naming the layouts that do: the option is the checkpoint's, not the user's to drop."""
    from model.attention.options import spelled, takers, unapplied

    target = registry.mixer(attention)
    for i in range(config.n_layer):
        layer = config.layer_config(i)
        if layer.attention != config.attention:  # a hybrid's linear layers keep their own layer
            continue
        for name, value, _ in unapplied(target, layer.attention_spec):
            holders = [t for t in takers(name) if t.startswith("attention=")]
            who = " or ".join(holders) or "its own layout"
            where = where_set(config, name, config.layer_kind_names[i])
            raise ValueError(f"attention={attention} cannot hold this checkpoint: its model sets {where}="
                             f"{spelled(value)}, which only {who} applies; load it as attention={config.attention} "
                             f"(its own) or one of those")  # fmt: skip


def model_from_checkpoint(
    ckpt: Checkpoint, attention: str | None = None, kernel: str | None = None, dropout: float | None = None
) -> GPT:
    """The GPT a checkpoint describes, optionally in another layout, kernel or dropout.

    SDPA's backend is left to PyTorch (the checkpoint's choice was for the device it trained on; it
    changes speed only), and a kernel without attention dropout (flex) gets none unless asked.
    """
    config = ckpt.config
    if attention is not None:
        check_converts(config.attention, attention)  # attention=mla's weights are another function's
        check_holds(config, attention)
    kernel = kernel or config.kernel
    if dropout is None:
        dropout = config.dropout if "dropout" in registry.kernel(kernel).applies else 0.0
    config = replace(config, attention=attention or config.attention, kernel=kernel, dropout=dropout,
                     sdpa_backend="auto")  # fmt: skip
    model = GPT(config)
    try:
        model.load_weights(ckpt.model)  # converts between layouts when they differ
    except ValueError as err:
        raise ValueError(f"the checkpoint's weights do not match its own config: {err}") from err
    model.select_sparse_keys(not in_indexer_warmup(ckpt))
    return model


def in_indexer_warmup(ckpt: Checkpoint) -> bool:
    """Whether the checkpoint was saved within sparse attention's warm-up (``trainer.indexer_warmup``), its last
    step and its validation dense: then it is read dense too, as it trained."""
    warmup = ((ckpt.train_config or {}).get("trainer") or {}).get("indexer_warmup") or 0
    return 0 < warmup and ckpt.step <= warmup
