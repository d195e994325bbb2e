"""Per-run summary rows, the comparability check, and the loss-difference flags."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import asdict

from analysis.runs import Run, natural_key
from common.machine_load import busy_text, is_busy
from common.optim_label import optimizer_text, schedule_text
from model.attention.differential import LAMBDA_INIT
from model.attention.modifications import score_mod_fields, with_fields
from model.config import GPTConfig, attention_label, schedule_kinds

FINAL_FRACTION = 0.1  # steps averaged into the final train loss
# Columns a report shows only when some run departs from plain multi-head attention over the whole context
# (GPT-2's: learned positions, no score modification, no latent).
SHOWN_WHEN = {"kv_heads": lambda row: row.get("kv_heads") not in (None, row.get("n_head")),
              "kv_latent": lambda row: row.get("kv_latent") is not None,
              "window": lambda row: bool(row.get("window")),
              "attention_chunk": lambda row: bool(row.get("attention_chunk")),
              "query_temperature": lambda row: bool(row.get("query_temperature")),
              "differential": lambda row: row.get("differential") is not None,
              "document_masking": lambda row: bool(row.get("document_masking")),
              "sparse_topk": lambda row: row.get("sparse_topk") is not None,
              "position": lambda row: row.get("position") not in (None, "learned"),
              "rope_theta": lambda row: row.get("rope_theta") not in (None, 10000),
              "rope_fraction": lambda row: row.get("rope_fraction") not in (None, 1),
              **{mod.field: (lambda row, mod=mod: mod.used(row.get(mod.field, mod.off))) for mod in with_fields()},
              "schedule": lambda row: row.get("schedule") is not None,
              "layers": lambda row: row.get("layers") is not None,
              "optimizer": lambda row: row.get("optimizer") not in (None, "AdamW"),
              "lr_schedule": lambda row: row.get("lr_schedule") not in (None, "cosine")}
# Shown only when the runs differ in it: the KV cache's bytes per token (key/value heads, a latent), the token
# budget (a sweep compared with --force).
SHOWN_WHEN_VARIED = ("kv_cache_bytes", "state_bytes", "token_budget")
# The figures a run's speed makes: a run whose speed is not its variant's own (it shared its machine, a busy
# machine, another split of the batch: flag_speed_conditions) marks each of them (SPEED_CAUTION).
SPEED_COLUMNS = ("tokens_per_sec", "step_ms", "mfu", "compile_s", "time_to_target_s")
SPEED_CAUTION = "†"
FLAG_SIGMAS = 3.0
ROUND_OFF = 1e-4  # a loss difference below this is round-off (the layouts compute one function), never a flag

COLUMNS = [
    ("label", "label"), ("layout", "layout"), ("kernel", "kernel"), ("kv_heads", "kv heads"),
    ("kv_latent", "kv latent"), ("window", "window"), ("attention_chunk", "chunk"), ("position", "position"),
    ("rope_theta", "rope theta"), ("rope_fraction", "rope fraction"), ("query_temperature", "query temperature"),
    *((mod.field, mod.column) for mod in with_fields()), ("differential", "differential lambda_init"),
    ("document_masking", "document masking"), ("sparse_topk", "sparse top-k"),
    ("schedule", "schedule"), ("layers", "layers"), ("optimizer", "optimizer"), ("lr_schedule", "lr schedule"),
    ("seed", "seed"), ("state", "state"),
    ("params", "params"), ("token_budget", "token budget"), ("kv_cache_bytes", "KV cache B/token"),
    ("state_bytes", "state B/sample"),
    ("micro_batch", "micro-batch"), ("sdpa_backend", "SDPA kernel"),
    ("final_train_loss", "final train loss"), ("best_val_loss", "best val loss"),
    ("best_val_bpb", "val bpb"), ("tokens_per_sec", "tokens/s"), ("step_ms", "step ms"),
    ("peak_mem_mb", "peak mem MB"), ("mfu", "MFU"), ("compile_s", "compile s"),
    ("time_to_target_s", "time to target s"),
    ("flag", "flag"),
]  # fmt: skip


def check_comparable(runs: list[Run], force: bool = False) -> None:
    """Refuse to compare runs trained on different data or token budgets, unless forced."""
    problems = []
    runs = [r for r in runs if r.failure is None]  # a failed run has no data or budget to compare
    for what, key in (("data", lambda r: r.info.get("data_dir")), ("token budgets", lambda r: r.token_budget)):
        values = {key(r) for r in runs}
        if len(values) > 1:
            problems.append(f"{what} differ: " + ", ".join(f"{r.path.name}={key(r)}" for r in runs))
    if problems and not force:
        raise ValueError(
            "these runs are not comparable: " + "; ".join(problems) + ". Compare runs of one sweep, "
            "or pass --force to compare them anyway"
        )


def default_target(runs: list[Run]) -> float | None:
    """The loss every finished run reached: the highest of their best validation losses."""
    bests = [min(e["val/loss"] for e in r.evals) for r in runs if r.evals and r.finished]
    return max(bests) if bests else None


def state_of(run: Run) -> str:
    """``finished``, or what the run is and how far it got: ``running 12/300``, ``stopped 40/300``, ``FAILED``."""
    if run.state in ("finished", "failed"):
        return run.state.upper() if run.state == "failed" else run.state
    return f"{run.state} {run.last_step}/{run.info['trainer'].get('max_steps', '?')}"


def token_budgets(runs: list[Run]) -> str:
    """The runs' token budget for a report's header: one number, or the range where runs differ (compared with
    --force; each run's in the table); never one number that is false for some run."""
    budgets = sorted({run.token_budget for run in runs if run.token_budget is not None})
    if not budgets:
        return "token budget unknown (no run recorded its tokens per step)"
    if len(budgets) == 1:
        return f"{budgets[0]:,} tokens per run"
    return f"{budgets[0]:,} to {budgets[-1]:,} tokens per run: each run's in the table"


def identity(run: Run) -> dict:
    """How the run attends: its layout, kernel (with a chosen SDPA backend), key/value heads (or latent width),
    window, position encoding and score modifications (a field an older run.json lacks counts as its default),
    a schedule's preset and kinds, and what its KV cache keeps per token."""
    m = run.info["model"]
    latent = m.get("kv_latent")
    layout, kernel = layers_run(run)
    return {"label": run.variant, "layout": layout, "kernel": kernel, "schedule": run.schedule,
            "n_head": m.get("n_head"),
            "kv_heads": None if latent is not None else m.get("n_kv_head") or m.get("n_head"),
            "kv_latent": latent, "window": by_kind(m, "window"), "attention_chunk": by_kind(m, "attention_chunk"),
            "query_temperature": by_kind(m, "query_temperature"), "position": m.get("position", "learned"),
            "differential": m.get("lambda_init", LAMBDA_INIT) if m.get("differential") else None,
            "document_masking": bool(m.get("document_masking")),
            "sparse_topk": by_kind(m, "sparse_topk"),  # DeepSeek's sparse attention: keys per query (None: dense)
            "rope_theta": m.get("rope_theta", 10000.0) if m.get("position") == "rope" else None,
            "rope_fraction": m.get("rope_fraction", 1.0) if m.get("position") == "rope" else None,
            **{mod.field: mod.row_value(m.get(mod.field, mod.off)) for mod in with_fields()},
            "layers": attention_label(m, sep="|").split("|")[-1] if m.get("layer_pattern") else None,
            "optimizer": optimizer_text(run.info.get("optim")), "lr_schedule": schedule_text(run.info.get("optim")),
            **decoding_bytes(run)}  # fmt: skip


def layers_run(run: Run) -> tuple[str | None, str | None]:
    """The layout and kernel (as ``kernel=`` spells it: sdpa_flash) the run's layers run: the model's; in a schedule
    whose kinds run others, each kind's (``K kda, M mla`` and ``M sdpa``: Kimi Linear's KDA layers run no kernel)."""
    kinds = schedule_kinds(run.info["model"])
    if kinds == schedule_kinds({**run.info["model"], "layer_kinds": {}}):  # every layer the model's own
        return run.layout, run.kernel_option
    split = {kind: ran.partition("/") for kind, ran in kinds.items()}
    return (", ".join(f"{kind} {layout}" for kind, (layout, _, _) in split.items()),
            ", ".join(f"{kind} {kernel}" for kind, (_, _, kernel) in split.items() if kernel) or None)


def by_kind(model: dict, name: str):
    """A per-layer option as a table cell says it: the model's value where every layer has it; in a schedule whose
    kinds differ in it, each kind's that sets one (``L 32``: Gemma 3's local layers' window, its global layers none)."""
    pattern, kinds = model.get("layer_pattern"), model.get("layer_kinds") or {}
    if not pattern:
        return model.get(name)
    values = {kind: (kinds.get(kind) or {}).get(name, model.get(name)) for kind in dict.fromkeys(pattern)}
    if len(set(map(repr, values.values()))) == 1:  # every kind alike
        return values[pattern[0]]
    return ", ".join(f"{kind} {value}" for kind, value in values.items() if value is not None) or None


def decoding_bytes(run: Run) -> dict[str, int | None]:
    """What decoding keeps, over every layer, in the run's dtype: ``kv_cache_bytes`` per token (the layout's
    ``cache_width``: keys and values, or a latent) and ``state_bytes`` per sample at any length (a linear
    layer's state); None where the run's model cannot be rebuilt here."""
    from dataclasses import fields

    import torch

    from model.config import GPTConfig

    m = run.info["model"]
    dtype = getattr(torch, str(run.info.get("dtype", "float32")), torch.float32)
    try:
        config = GPTConfig(**{f.name: m[f.name] for f in fields(GPTConfig) if f.name in m})
        width, state = sum(config.cache_widths), config.state_bytes(torch.finfo(dtype).bits // 8)
    except (ValueError, TypeError, KeyError):  # a layout or option this checkout does not know
        return {"kv_cache_bytes": None, "state_bytes": None}
    return {"kv_cache_bytes": width * (torch.finfo(dtype).bits // 8), "state_bytes": state}


def failed_row(run: Run) -> dict:
    row = {key: None for key, _ in COLUMNS}
    row.update(identity(run), seed=run.seed, state=state_of(run), token_budget=run.token_budget,
               final_train_loss_se=None, flag=f"FAILED: {run.failure}")  # fmt: skip
    return row


def summarize(run: Run, target: float | None) -> dict:
    if run.failure is not None:
        return failed_row(run)
    steps, evals = run.steps, run.evals
    steady = run.steady_steps()
    final = steps[-max(1, int(len(steps) * FINAL_FRACTION)) :]
    losses = [s["train/loss"] for s in final]
    best = min(evals, key=lambda e: e["val/loss"]) if evals else None
    memory = [s.get("perf/peak_mem_mb", s.get("perf/max_rss_mb")) for s in steps]
    mfu = [s["perf/mfu"] for s in steady if "perf/mfu" in s]
    return {
        **identity(run),
        "seed": run.seed,
        "state": state_of(run),
        "params": run.info.get("params"),
        "token_budget": run.token_budget,
        "micro_batch": run.info["trainer"].get("micro_batch_size"),
        "sdpa_backend": run.info.get("sdpa_backend"),
        "final_train_loss": statistics.fmean(losses) if losses else math.nan,
        # the standard error of that mean: how much batch-to-batch noise it carries
        "final_train_loss_se": statistics.stdev(losses) / math.sqrt(len(losses)) if len(losses) > 1 else 0.0,
        "best_val_loss": best["val/loss"] if best else math.nan,
        "best_val_bpb": best.get("val/bpb", math.nan) if best else math.nan,
        "tokens_per_sec": statistics.median(s["perf/tokens_per_sec"] for s in steady) if steady else math.nan,
        "step_ms": statistics.median(s["perf/step_ms"] for s in steady) if steady else math.nan,
        "peak_mem_mb": max((m for m in memory if m is not None), default=math.nan),
        "mfu": statistics.median(mfu) if mfu else None,
        "compile_s": run.compile_seconds,
        "time_to_target_s": time_to_target(run, target),
        "flag": "",
    }


def time_to_target(run: Run, target: float | None) -> float | None:
    """Training seconds until val/loss first reached target (``Run.training_seconds``: evaluation,
    compilation and the warm-up steps' excess excluded)."""
    if target is None:
        return None
    by_step = run.training_seconds()
    reached = next((e["step"] for e in run.evals if e["val/loss"] <= target), None)
    return by_step.get(reached) if reached is not None else None


def flag_loss_differences(runs: list[Run], rows: list[dict]) -> str:
    """Mark variants whose loss differs by more than the noise from the median of the variants that compute the
    same function (``Run.function``: layouts and kernels of one function should agree) and trained alike (one
    token budget, one data); say how. Variants of different functions (another position encoding, a softcap, a
    latent) are compared by the table, not flagged; runs of one variant are repeats of one function."""
    by_variant = runs_by_variant(runs)
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for key, ix in by_variant.items():
        groups[(runs[ix[0]].function, *trained_alike(runs[ix[0]]))].append(key)
    name = variant_namer(by_variant)
    if all(len(keys) == 1 for keys in groups.values()):
        functions: dict[object, list[str]] = defaultdict(list)  # one function, trained otherwise (a continuation)
        for key, ix in by_variant.items():
            functions[runs[ix[0]].function].append(name(key))
        unlike = [names for names in functions.values() if len(names) > 1]
        return nothing_to_flag([(name(key), len(ix)) for key, ix in by_variant.items()], unlike)
    seeds = {key: sorted({runs[i].seed for i in ix}) for key, ix in by_variant.items()}
    replicated = [key for key in by_variant if len(seeds[key]) > 1]
    if replicated:  # several seeds of a variant: the noise is their spread (repeats of one seed measure none)
        metric = "best_val_loss"
        spreads = [statistics.stdev(seed_means(runs, rows, by_variant[key], metric)) for key in replicated]
        noise = math.sqrt(statistics.fmean(s * s for s in spreads))
        how = f"the seed-to-seed spread of the best val loss, from {len(replicated)} variant(s) with several seeds"
    else:  # one seed per variant: the noise of each final train loss from its own steps
        metric = "final_train_loss"
        noise = math.sqrt(2) * statistics.median(r["final_train_loss_se"] for r in rows)
        repeated = any(len(ix) > 1 for ix in by_variant.values())
        repeats = " (runs repeating one seed measure no seed noise)" if repeated else ""
        how = (
            f"the batch noise of the final train loss; no variant has several seeds{repeats}: "
            "add seeds with `-m ... trainer.seed=1,2,3` to measure run-to-run noise"
        )
    means = {key: statistics.fmean(rows[i][metric] for i in ix) for key, ix in by_variant.items()}
    limit = max(FLAG_SIGMAS * noise, ROUND_OFF)  # no noise measured (one final step): round-off is the floor
    for keys in groups.values():
        center = statistics.median(means[key] for key in keys)
        for key in keys:
            diff = means[key] - center
            if abs(diff) > limit:
                for i in by_variant[key]:
                    rows[i]["flag"] = f"{metric} {diff:+.4f} vs median"
    among = "the variants" if len(groups) == 1 else "the variants of its function"
    if noise == 0 and not replicated:  # one step in each final stretch: nothing measured, said as such
        return (f"{metric} differing from the median of {among} by more than {ROUND_OFF:g} (round-off): no noise "
                f"was measured, since each run's final stretch is one step and no variant has several seeds; train "
                f"longer, or add seeds with `-m ... trainer.seed=1,2,3`, before reading a difference as a ranking")
    return (f"{metric} differing from the median of {among} by more than {FLAG_SIGMAS:g} x {noise:.4f} "
            f"(and {ROUND_OFF:g}, round-off), {how}")


def trained_alike(run: Run) -> tuple:
    """What two runs must share for their losses to be compared: the token budget and the data (they may differ
    in a sweep compared with --force), and how they were optimised (``Run.optimizer``: under Muon as stored, layouts
    of one function take other steps)."""
    return run.token_budget, run.info.get("data_dir"), run.optimizer


def runs_by_variant(runs: list[Run]) -> dict[tuple, list[int]]:
    """The runs (indices) of each variant trained alike: its seeds, and any repeats of a seed."""
    found: dict[tuple, list[int]] = defaultdict(list)
    for i, run in enumerate(runs):
        found[(run.variant, *trained_alike(run))].append(i)
    return dict(found)


def variant_namer(by_variant: dict[tuple, list[int]]):
    """How a report names a (variant, budget, data) key: the variant, with its token budget where one variant
    was trained on several."""
    labels = [key[0] for key in by_variant]
    return lambda key: key[0] if labels.count(key[0]) == 1 else f"{key[0]} ({key[1]:,} tokens)"


def seed_means(runs: list[Run], rows: list[dict], ix: list[int], metric: str) -> list[float]:
    """The metric of each seed among the runs ``ix`` (runs repeating a seed averaged: one value per seed)."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    for i in ix:
        by_seed[runs[i].seed].append(rows[i][metric])
    return [statistics.fmean(values) for values in by_seed.values()]


def nothing_to_flag(variants: list[tuple[str, int]], unlike: list[list[str]] = ()) -> str:
    """The rule's text where no two variants that compute the same function trained alike: what the runs are, said
    truly (several runs of one variant compute one function; ``unlike``: variants of one function trained on other
    token budgets or data, as a run and its continuation are, or optimised otherwise)."""
    if unlike:
        named = "; ".join(" and ".join(names) for names in unlike)
        return (f"a loss differing from the variants of its function trained alike: those here that compute one "
                f"function ({named}) trained on other token budgets or data, or with other optimizers, so their "
                f"losses are not compared")
    repeated = [f"{n} runs of {name}" for name, n in variants if n > 1]
    if len(variants) == 1:
        return (f"a loss differing from the other variants of its function: every run here is one variant "
                f"({repeated[0]}, one function), so none is flagged")  # fmt: skip
    if not repeated:
        return (f"a loss differing from the variants of its function, and none here computes the same function as "
                f"another (the {len(variants)} variants' losses differ by design)")  # fmt: skip
    return (f"a loss differing from the other variants of its function: no two of the {len(variants)} variants "
            f"compute the same function (their losses differ by design); the {' and the '.join(repeated)} "
            f"compute one function")  # fmt: skip


def build_rows(runs: list[Run], target: float | None) -> tuple[list[dict], str]:
    """A row per run; loss flags compare the finished runs that evaluated, speed flags every run whose speed
    figures were taken in conditions that make them not its variant's own (``flag_speed_conditions``)."""
    rows = [summarize(run, target) for run in runs]
    done = [i for i, run in enumerate(runs) if run.finished and run.evals and run.steps]
    if len(done) > 1:
        rule = flag_loss_differences([runs[i] for i in done], [rows[i] for i in done])
    else:
        rule = f"{len(done)} finished run(s) with evaluations: too few to compare losses"
    flag_speed_conditions(runs, rows)
    return rows, rule


def add_flag(row: dict, note: str) -> None:
    row["flag"] = f"{row['flag']}; {note}" if row["flag"] else note


def flag_speed_conditions(runs: list[Run], rows: list[dict]) -> None:
    """Say why a run's speed is not its variant's own, and mark each of its speed figures (``SPEED_CAUTION``): it
    ran alongside another run on its machine (and GPU), on a busy machine (other processes used a share of the
    cores), or under another split of the batch (micro-batch, accumulation, ranks) or after fewer tokens than
    the runs it is compared with; ``speed_why`` says it in a few words, for the plots. A compile time read partly
    from the compile cache says so in its own cell."""
    reasons: dict[int, list[tuple[str, str]]] = defaultdict(list)  # (in a few words, in full)
    for i, others in overlapping_runs(runs).items():
        reasons[i].append(("ran alongside another run", "ran alongside " + ", ".join(
            f"{runs[j].variant} (seed {runs[j].seed})" for j in others)))  # fmt: skip
    for i, run in enumerate(runs):
        others, n_cores = run.others_cores(), run.info.get("cores")
        if is_busy(others, n_cores):
            reasons[i].append(("busy machine", f"a busy machine ({busy_text(others, n_cores)})"))
    trained = [i for i, run in enumerate(runs) if run.failure is None and run.steps]
    splits = {i: runs[i].batch_split for i in trained}
    if len(set(splits.values())) > 1:
        every = ", ".join(sorted({split_text(split) for split in splits.values()}, key=natural_key))
        for i, split in splits.items():
            reasons[i].append(("another batch split",
                               f"micro-batch {split_text(split)} where the runs split their batch as {every}"))
    seen = {i: runs[i].tokens_seen for i in trained if runs[i].tokens_seen is not None}
    most = max(seen.values(), default=None)
    for i, tokens in seen.items():
        if tokens < most:
            reasons[i].append(("fewer tokens seen", f"{tokens:,} tokens seen where another run saw {most:,}"))
    for i, why in reasons.items():
        add_flag(rows[i], "; ".join(full for _, full in why) + ": its speed is not comparable")
        rows[i]["speed_caution"] = True  # each of its speed figures carries SPEED_CAUTION
        rows[i]["speed_why"] = ", ".join(short for short, _ in why)
    cached = {i: runs[i].compile_cache_hits for i in trained if runs[i].compile_cache_hits is not None}
    if any(hits for hits, _ in cached.values()):
        for i, (hits, total) in cached.items():
            rows[i]["compile_cached"] = f"{hits}/{total}"
            if hits:
                add_flag(rows[i], f"compile s read {hits} of {total} graphs from the compile cache (an earlier run "
                                  f"or job compiled them): not a cold compile")  # fmt: skip


def speed_cautions(runs: list[Run], rows: list[dict]) -> dict[str, str]:
    """Each variant with a run whose speed is not its own, and why in a few words (its runs' reasons together):
    what the loss-against-time plot pales and says."""
    why: dict[str, dict[str, None]] = defaultdict(dict)
    for run, row in zip(runs, rows):
        if row.get("speed_caution"):
            why[run.variant].update(dict.fromkeys(row["speed_why"].split(", ")))
    return {variant: ", ".join(reasons) for variant, reasons in why.items()}


def split_text(split: tuple[int | None, int | None, int]) -> str:
    """``16 x 4 accumulation steps`` (x 2 ranks): how a step's batch was split."""
    micro, accum, ranks = split
    text = f"{micro if micro is not None else '?'} x {accum if accum is not None else '?'} accumulation step(s)"
    return text + (f" x {ranks} ranks" if ranks > 1 else "")


def overlapping_runs(runs: list[Run]) -> dict[int, list[int]]:
    """For each run, the runs that ran at the same time on the same host and device (any two CPU runs of a
    host share its cores; GPU runs share a GPU only when its UUID is the same)."""
    spans = [run.active_spans() for run in runs]
    found: dict[int, list[int]] = defaultdict(list)
    for i in range(len(runs)):
        for j in range(len(runs)):
            if i != j and any(h1 == h2 and d1 == d2 and s1 < e2 and s2 < e1
                              for h1, d1, s1, e1 in spans[i] for h2, d2, s2, e2 in spans[j]):  # fmt: skip
                found[i].append(j)
    return dict(found)


def format_value(key: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if key == "position":
        return position_label(value)
    if key in ("params", "kv_cache_bytes", "state_bytes", "token_budget"):
        return f"{value:,}"
    if isinstance(value, bool):
        return "yes" if value else "-"
    if key in ("rope_theta", "rope_fraction", *score_mod_fields()):  # a number (the softcap), or a word (the gate)
        return f"{value:g}" if isinstance(value, int | float) else str(value)
    if key == "mfu":
        return f"{100 * value:.1f}%"
    if key in ("tokens_per_sec", "peak_mem_mb"):
        return f"{value:,.0f}"
    if key in ("step_ms", "time_to_target_s", "compile_s"):
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def shown_columns(rows: list[dict]) -> list[tuple[str, str]]:
    """The table's columns: every one, but the attention options (key/value heads, latent, window, position,
    score modifications) only when some run departs from the default (then every row shows its value: 4
    key/value heads of 4 too), and the KV cache's bytes per token and the token budget only when the runs differ
    in it (a value unknown, as a run failed before it recorded its budget, differs from none)."""
    return [(k, t) for k, t in COLUMNS
            if (k not in SHOWN_WHEN or any(SHOWN_WHEN[k](row) for row in rows))
            and (k not in SHOWN_WHEN_VARIED or len({row.get(k) for row in rows} - {None}) > 1)]  # fmt: skip


def csv_columns(rows: list[dict]) -> list[str]:
    """The CSV's columns: the table's, and key/value heads and window always (as the CSV always had them)."""
    shown = {k for k, _ in shown_columns(rows)}
    return [k for k, _ in COLUMNS if k in shown or k in ("kv_heads", "window")]


def position_label(position: str) -> str:
    """A position encoding as run labels spell it (``model.config.attention_label``): ``nopos`` for none, so that a
    table row and a plot legend say one word."""
    model = {**asdict(GPTConfig()), "position": position}
    return attention_label(model, show=("position",)).rsplit("-", 1)[-1]


def markdown_table(rows: list[dict]) -> str:
    switches = [mod.field for mod in with_fields() if mod.off is False]  # yes or -: QK-norm, sinks
    text = ("label", "layout", "kernel", "position", *switches, "schedule", "layers", "optimizer", "lr_schedule",
            "state", "sdpa_backend", "flag")  # fmt: skip
    columns = shown_columns(rows)
    align = [" --- " if key in text else " ---: " for key, _ in columns]
    lines = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(table_cell(row, k) for k, _ in columns) + " |")
    return "\n".join(lines)


def table_cell(row: dict, key: str) -> str:
    """A cell of the markdown table: its value, marked where it is a speed figure not comparable
    (``speed_caution_note`` says what the mark means); a compile time says how much the compile cache gave."""
    text = format_value(key, row[key])
    if key == "compile_s" and row.get("compile_cached") and text != "-":
        text += f" ({row['compile_cached']} cached)"
    return f"{text} {SPEED_CAUTION}" if row.get("speed_caution") and key in SPEED_COLUMNS and text != "-" else text


def speed_caution_note(rows: list[dict]) -> str:
    """The lines under the table that say what the marks mean ("" where no figure carries one)."""
    notes = []
    if any(row.get("speed_caution") for row in rows):
        notes.append(f"{SPEED_CAUTION} not the variant's own speed (its flag says why: it ran alongside another run "
                     f"on the same machine, a busy machine, another split of the batch or fewer tokens seen): its "
                     f"speed figures (tokens/s, step ms, MFU, compile s, time to target) are not comparable.")
    if any(row.get("compile_cached") for row in rows):
        notes.append("compile s (h/n cached): h of the compile's n graphs were read from the compile cache, which an "
                     "earlier run or job warmed; only times with 0 cached are cold compiles.")
    return "".join(f"{note}\n" for note in notes)


def parameter_counts(runs: list[Run]) -> str:
    """The runs' parameter count for a report's header: one number, or the range where variants differ in size
    (grouped-query heads have smaller key/value projections); each run's count is in the table."""
    counts = sorted({run.info["params"] for run in runs if run.info.get("params")})
    if not counts:
        return "? parameters"
    if len(counts) == 1:
        return f"{counts[0]:,} parameters"
    return f"{counts[0]:,} to {counts[-1]:,} parameters: each run's in the table"


def profile_table(runs: list[Run]) -> str | None:
    """Milliseconds per step by kind for the runs profiled with ``trainer.profile=true`` (None if none were)."""
    profiled = [(run, run.profile) for run in runs if run.profile is not None]
    if not profiled:
        return None
    kinds = [k for k in profiled[0][1]["ms_per_step"] if any(p["ms_per_step"].get(k, 0) > 0 for _, p in profiled)]
    lines = ["| run | SDPA kernel | step ms | " + " | ".join(kinds) + " |",
             "| --- | --- | ---: |" + " ---: |" * len(kinds)]  # fmt: skip
    for run, p in profiled:
        cells = [f"{p['ms_per_step'].get(k, 0):,.2f}" for k in kinds]
        lines.append(f"| {run.variant} (seed {run.seed}) | {p['sdpa_backend']} | {p['wall_ms_per_step']:,.1f} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines)
