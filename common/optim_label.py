"""How a run's name and a report spell its optimizer and learning-rate schedule.

Nothing where they are the defaults (AdamW, warmup then cosine), so every name made before Muon and the other
schedules stands: ``fused_qkv-sdpa-nano``; otherwise ``-muon`` (Muon as each weight is stored), ``-muon_qkv``,
``-muon_heads``, each Muon option set away from its default (``-muon-lr0.01-mom0.9-nonesterov-ns3-adj_none-wd0.1``),
and the schedule (``-wsd``, ``-wsd0.4_1sqrt`` for another decay fraction and shape, ``-constant``). The defaults of
the optimizer fields the label spells live here, where the training config (training/config.py) takes them from and
the reports (analysis/), which cannot read the trainer, find them for runs that predate a field.
"""

from __future__ import annotations

OPTIM_DEFAULTS = {
    "name": "adamw",  # adamw | muon
    "schedule": "cosine",  # cosine | wsd | constant
    "decay_fraction": 0.2,  # wsd: the share of the steps its decay takes (nanochat's first warmdown_ratio)
    "decay_shape": "linear",  # wsd: linear | 1-sqrt
    # Muon's, from Keller Jordan's Muon, modded-nanogpt and nanochat (torch.optim.Muon's momentum, Nesterov, steps)
    "muon_lr": 0.02,
    "muon_momentum": 0.95,
    "muon_nesterov": True,
    "muon_ns_steps": 5,
    "muon_adjust_lr": "original",  # original: sqrt(max(1, rows / cols)) | match_rms_adamw: 0.2 sqrt(max) | none
    "muon_weight_decay": 0.0,  # Keller Jordan's and nanochat's first Muon had none (torch.optim.Muon's default: 0.1)
    "muon_split": "as_stored",  # as_stored | qkv | heads
}
# Each Muon option's part of the label where it differs from its default: a format of its value
MUON_PARTS = {"muon_lr": "lr{:g}", "muon_momentum": "mom{:g}", "muon_ns_steps": "ns{}", "muon_adjust_lr": "adj_{}",
              "muon_weight_decay": "wd{:g}"}  # fmt: skip
SPLIT_WORDS = {"as_stored": "as stored", "qkv": "by Q/K/V", "heads": "by head"}
# The optim fields a run's label spells (train.py leaves them out of a sweep's name suffix: the label says them)
LABELLED = tuple(OPTIM_DEFAULTS)


def settings(optim: dict | None) -> dict:
    """The optimizer fields of ``optim`` (a run.json's ``optim``, or ``vars`` of the config), a field it lacks (a run
    from before the field) at its default."""
    return {**OPTIM_DEFAULTS, **{k: v for k, v in (optim or {}).items() if k in OPTIM_DEFAULTS}}


def optimizer_label(optim: dict | None) -> str:
    """``muon_qkv-lr0.01`` (Muon, its split where not as stored, each option that differs), "" for AdamW."""
    o = settings(optim)
    if o["name"] == OPTIM_DEFAULTS["name"]:
        return ""
    parts = [o["name"] + ("" if o["muon_split"] == OPTIM_DEFAULTS["muon_split"] else f"_{o['muon_split']}")]
    for key, spelling in MUON_PARTS.items():
        if o[key] != OPTIM_DEFAULTS[key]:
            parts.append(spelling.format(o[key]))
        if key == "muon_momentum" and o["muon_nesterov"] != OPTIM_DEFAULTS["muon_nesterov"]:
            parts.append("nonesterov" if not o["muon_nesterov"] else "nesterov")
    return "-".join(parts)


def schedule_label(optim: dict | None) -> str:
    """``wsd``, ``wsd0.4_1sqrt``, ``constant``; "" for cosine (the default)."""
    o = settings(optim)
    if o["schedule"] == OPTIM_DEFAULTS["schedule"]:
        return ""
    if o["schedule"] != "wsd":
        return o["schedule"]
    fraction = "" if o["decay_fraction"] == OPTIM_DEFAULTS["decay_fraction"] else f"{o['decay_fraction']:g}"
    shape = "" if o["decay_shape"] == OPTIM_DEFAULTS["decay_shape"] else f"_{o['decay_shape'].replace('-', '')}"
    return f"wsd{fraction}{shape}"  # no "-" inside: a label's parts are split at it (1-sqrt is spelled 1sqrt)


# Each part's pattern and title, for a plot's legend (``analysis/plots.py``): what a label's optional parts are
LABEL_PARTS = ((r"muon(_\w+)?", "-<optimizer>[-<its options>]"), (r"wsd[\d.]*(_\w+)?|constant", "-<lr schedule>"))


def training_label(optim: dict | None) -> str:
    """The optimizer's and the schedule's parts of a run's label together (``muon_qkv-wsd``), "" for the defaults."""
    return "-".join(part for part in (optimizer_label(optim), schedule_label(optim)) if part)


def optimizer_text(optim: dict | None) -> str:
    """A report's cell: ``AdamW``, ``Muon as stored``, ``Muon by Q/K/V``, ``Muon by head``, with the options set."""
    o = settings(optim)
    if o["name"] != "muon":
        return "AdamW" if o["name"] == "adamw" else str(o["name"])
    options = optimizer_label(optim).split("-")[1:]
    return f"Muon {SPLIT_WORDS.get(o['muon_split'], o['muon_split'])}" + (f" ({', '.join(options)})" if options else "")


def schedule_text(optim: dict | None) -> str:
    """A report's cell: ``cosine``, ``constant``, ``wsd (decay 20%, linear)``."""
    o = settings(optim)
    if o["schedule"] != "wsd":
        return str(o["schedule"])
    return f"wsd (decay {o['decay_fraction']:.0%}, {o['decay_shape']})"
