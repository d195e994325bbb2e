"""The one "must match" rule for reusing a checkpoint, read from the config's own field metadata.

Each field of the training config says what changing it means (``metadata={"reuse": <kind>}``; a field
without one takes its group's, and a group without one is ``training``)::

    label           a name; no effect on any number (model.name, data.name)
    weights         the parameters' shapes (n_layer, n_head, n_embd, bias, vocab_size, n_kv_head)
    positions       model.block_size: the position table's length
    layout          how the weights are arranged (model.attention): they convert, an optimizer state does not
    function        what the model computes with the same weights (model.window)
    optimizer       which optimizer (optim.name): its state is what a resume continues (another cannot load it)
    training        what the losses depend on (dropout, the data, the optimizer's settings, the seed, the batch)
    implementation  the same numbers up to round-off (model.kernel, model.sdpa_backend)
    measure         how a metric is measured (trainer.eval_windows: the windows val/loss averages over)
    machine         where and how fast, never the numbers (cache folders, threads, devices, logging, ...)
    budget          trainer.max_steps: a larger one extends the run (the schedule is re-planned)

Three ways reuse a checkpoint, and each keeps the kinds ``KEPT`` names:

- ``init_from``: a new run from the weights, converted to this run's layout; a shorter context crops the
  positions (as nanoGPT's fine-tuning does);
- ``resume`` (``trainer.resume=<dir>``): a new run directory from a run's whole training state (its optimizer's
  state too: the same optimizer; its settings, a learning rate, may change);
- ``continue`` (``trainer.resume=auto``, a requeued SLURM job): the same run, in place, with the same losses.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import MISSING, dataclass, fields

from training.config import TrainConfig

KINDS = ("label", "weights", "positions", "layout", "function", "optimizer", "training", "implementation", "measure",
         "machine", "budget")  # fmt: skip
KEPT = {
    "init_from": ("weights", "positions"),
    "resume": ("weights", "positions", "layout", "function", "optimizer"),
    "continue": ("label", "weights", "positions", "layout", "function", "optimizer", "training", "implementation",
                 "measure"),
}
# What decides how val/loss is measured: a run resumed in a new directory with another of these starts its
# validation curve (a new wandb run) and its best anew instead of comparing two measures.
VALIDATION = ("measure", "data")
SHORTER_ALLOWED = {"init_from": ("positions",)}  # kinds a reuse may make smaller (a cropped position table)


def field_kinds(schema=TrainConfig) -> dict[str, str]:
    """``group.field`` -> its kind (``model.window`` -> ``function``), for every field of the schema's groups."""
    kinds = {}
    for group in fields(schema):
        group_kind = group.metadata.get("reuse", "training")
        for f in fields(group.default_factory):
            kinds[f"{group.name}.{f.name}"] = f.metadata.get("reuse", group_kind)
    return kinds


def field_defaults(schema=TrainConfig) -> dict[str, object]:
    """``group.field`` -> its default value (None where it has none)."""
    defaults = {}
    for group in fields(schema):
        for f in fields(group.default_factory):
            default = f.default if f.default is not MISSING else None
            defaults[f"{group.name}.{f.name}"] = f.default_factory() if f.default_factory is not MISSING else default
    return defaults


@dataclass(frozen=True)
class Difference:
    key: str  # group.field, as an override spells it: model.window
    kind: str
    saved: object  # the checkpoint's value
    now: object  # this run's


def differences(how: str, saved: dict, now: dict) -> list[Difference]:
    """What ``how`` (init_from | resume | continue) refuses: the kept fields whose values differ between the
    checkpoint's config (``saved``: ``{"model": {...}, ...}``) and this run's (``now``), in the schema's
    order. Only the groups both give are compared; a field one side lacks (an older checkpoint) counts as
    its default."""
    kept, shorter = KEPT[how], SHORTER_ALLOWED.get(how, ())
    defaults = field_defaults()
    found = []
    for key, kind in field_kinds().items():
        group, name = key.split(".")
        if kind not in kept or group not in saved or group not in now:
            continue
        # A field the checkpoint lacks was added after it was written: it had the field's default.
        before, after = saved[group].get(name, defaults[key]), now[group].get(name, defaults[key])
        if before == after or (kind in shorter and after is not None and before is not None and after < before):
            continue
        found.append(Difference(key, kind, before, after))
    return found


def validation_changes(saved: dict, now: dict) -> list[Difference]:
    """The differences that change how val/loss is measured (the windows, the data), for ``resume``."""
    defaults = field_defaults()
    found = []
    for key, kind in field_kinds().items():
        group, name = key.split(".")
        if (kind in VALIDATION or group in VALIDATION) and group in saved and group in now:
            before, after = saved[group].get(name, defaults[key]), now[group].get(name, defaults[key])
            if before != after and kind not in ("machine", "label"):
                found.append(Difference(key, kind, before, after))
    return found


def restoring(diffs: list[Difference]) -> str:
    """The overrides that give this run the checkpoint's values of ``diffs``, as a user types them (quoted for the
    shell where needed): ``model.sparse_topk=16``; inside a mapping (a schedule's kinds) each entry that differs,
    ``+model.layer_kinds.M.sparse_topk=16`` where this run lacks it and ``~model.layer_kinds.M.window`` where the
    checkpoint did."""
    return " ".join(shell_word(o) for d in diffs for o in _overrides(d.key, d.saved, d.now))


def settings(diffs: list[Difference], side: str = "now") -> str:
    """The values ``diffs`` hold on one ``side`` (``now``: this run's, ``saved``: the checkpoint's), as a user types
    them: ``model.window=4 optim.name=adamw``; inside a mapping each entry that differs
    (``model.layer_kinds.A.window=8``), and ``no model.layer_kinds.B.window`` where that side lacks it."""
    return " ".join(_settings(diffs, side))


def differ(diffs: list[Difference], side: str = "now") -> str:
    """``settings`` and the verb that agrees with them: ``model.window=4 differs``, ``... optim.name=adamw differ``."""
    words = _settings(diffs, side)
    return f"{' '.join(words)} {'differs' if len(words) == 1 else 'differ'}"


def _settings(diffs: list[Difference], side: str) -> list[str]:
    other = "saved" if side == "now" else "now"
    return [o if o.startswith("no ") else shell_word(o)
            for d in diffs for o in _values(d.key, getattr(d, side), getattr(d, other))]


def _values(key: str, value, other) -> list[str]:
    if isinstance(value, dict) and isinstance(other, dict):
        found = []
        for name, v in value.items():
            if name not in other or v != other[name]:
                found += _values(f"{key}.{name}", v, other.get(name))
        return found + [f"no {key}.{name}" for name in other if name not in value]
    return [f"{key}={hydra_value(value)}"]


def shell_word(text: str) -> str:
    """``text`` as one shell word: as it is where nothing in it is special, else in double quotes (which leave a
    Hydra value's single quotes readable), else as ``shlex`` quotes it."""
    if re.fullmatch(r"[\w.+=:/@%,-]+", text):
        return text
    return f'"{text}"' if not re.search(r'["$`\\!]', text) else shlex.quote(text)


def _overrides(key: str, saved, now) -> list[str]:
    if isinstance(saved, dict) and isinstance(now, dict):
        found = []
        for name, value in saved.items():
            if name not in now:
                found.append(f"+{key}.{name}={hydra_value(value)}")
            elif value != now[name]:
                found += _overrides(f"{key}.{name}", value, now[name])
        return found + [f"~{key}.{name}" for name in now if name not in saved]
    return [f"{key}={hydra_value(saved)}"]


def hydra_value(value) -> str:
    """``value`` in Hydra's override grammar: null, true, 16, 0.5, kda, 'two words', {a:1,b:null}, [1,2]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, str) and not reads_as_itself(value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def reads_as_itself(text: str) -> bool:
    """Whether Hydra reads ``text`` unquoted as this string: a plain word or path, not a number or a constant."""
    return bool(re.fullmatch(r"[\w./-]+", text)) and not re.fullmatch(r"[-+\d.e]+|null|true|false|nan|inf", text, re.I)
