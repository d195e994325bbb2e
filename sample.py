"""Sample text from a checkpoint or a pretrained GPT-2: ``python sample.py source=... [key=value ...]``.

    python sample.py source=runs/2026-11-21/10-00-00_fused_qkv-sdpa prompt="def "
    python sample.py source=runs/.../best.pt attention=wrapper kernel=manual   # any layout
    python sample.py source=gpt2 prompt="The meaning of life is" temperature=0  # greedy GPT-2
    python sample.py source=runs/... prompt="def foo(x, y):"                  # any text, as typed
    echo "import os" | python sample.py source=runs/... prompt=-              # prompt from stdin

Tokens stream to stdout as they are generated; notices and speed go to stderr.
"""

from __future__ import annotations

from common.startup import guard_start_up, start_up_over

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import codecs
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from cli import (
    check_at_least,
    check_attention_and_kernel,
    check_overrides,
    refuse_renamed_options,
    take_layout_options,
    take_text_options,
    user_errors,
    with_layout_options,
)
from common.machine_load import OthersLoad, busy_text, is_busy
from data.tokenizers import EOT
from model import GPTConfig, load_model, registry
from model.config import attention_label
from model.decoding.context import check_past_context, with_context
from model.decoding.generation import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, context_lengths, generate_batch
from model.decoding.steps import bandwidth_share, choose_decoding, weight_bytes
from model.device import inductor_cache_per_cpu_capability, resolve_device, resolve_dtype


@dataclass
class SampleConfig:
    source: str = MISSING  # a run directory, a checkpoint file, gpt2[-medium|-large|-xl], or an HF folder
    prompt: str = ""  # the text to continue, as typed (code too); "-" reads standard input; empty: <|endoftext|>
    prompt_file: str | None = None  # read the prompt from this file instead
    num_samples: int = 1
    max_new_tokens: int = 256
    temperature: float = DEFAULT_TEMPERATURE  # 0 is greedy
    top_k: int | None = DEFAULT_TOP_K
    top_p: float = 1.0  # nucleus sampling: keep the most likely tokens up to this probability
    seed: int = 1337
    device: str = "auto"
    dtype: str = "auto"  # the weights' dtype: auto (bf16/fp16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16
    compile: bool = False  # compile the decoding step (inductor; on a GPU then captured as a graph): tens of seconds
    attention: str | None = None  # run the weights in another QKV layout: wrapper | separate_qkv | fused_qkv
    kernel: str | None = None  # manual | sdpa | flex
    use_cache: bool = True  # the KV cache; false recomputes the whole context for every token
    past_context: str = "ring"  # past block_size (rope|alibi|none): ring (its last block_size keys) | full (every key)


ConfigStore.instance().store(name="sample_schema", node=SampleConfig)
USAGE = "python sample.py source=<run dir | checkpoint.pt | gpt2 | hf folder> [prompt=...] [key=value ...]"


def notice(message: str) -> None:
    print(f"[sample] {message}", file=sys.stderr, flush=True)


def check(cfg: SampleConfig) -> None:
    """Every option, before the model is loaded; errors name the option as typed."""
    if not 0.0 < cfg.top_p <= 1.0:
        raise ValueError(f"top_p={cfg.top_p} must be in (0, 1]; 1 keeps every token")
    if not cfg.temperature >= 0:
        raise ValueError(f"temperature={cfg.temperature} must be >= 0 (0 is greedy)")
    check_at_least("num_samples", cfg.num_samples, 1)
    check_at_least("max_new_tokens", cfg.max_new_tokens, 0)
    check_at_least("seed", cfg.seed, 0)
    if cfg.top_k is not None:
        check_at_least("top_k", cfg.top_k, 1, " (or null for no limit)")
    check_attention_and_kernel(cfg.attention, cfg.kernel)
    check_past_context(cfg.past_context)
    cfg.prompt = cfg.prompt or ""  # prompt=null: unset
    if cfg.prompt_file is not None and cfg.prompt != "":
        raise ValueError(f"prompt={cfg.prompt!r} and prompt_file={cfg.prompt_file!r} are both set; give one")


def read_prompt(cfg: SampleConfig) -> str:
    if cfg.prompt_file is not None:
        path = Path(cfg.prompt_file).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"prompt_file={cfg.prompt_file!r} does not exist")
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"prompt_file={cfg.prompt_file!r} is not UTF-8 text (byte {err.start}); "
                             f"convert it (e.g. iconv -t utf-8)") from None
    return sys.stdin.read() if cfg.prompt == "-" else cfg.prompt


def prompt_ids(text: str, tokenizer, block_size: int) -> list[int]:
    if not text:
        notice(f"empty prompt: starting from {EOT}")
        return [tokenizer.eot_id]
    ids = tokenizer.encode(text)
    if len(ids) > block_size:
        notice(f"the prompt has {len(ids)} tokens, more than block_size={block_size}: kept its last {block_size}")
        ids = ids[-block_size:]
    return ids


def compiles_before_first_tokens(kernel, masks: tuple, prompt_len: int, use_cache: bool,
                                 max_new_tokens: int) -> bool:  # fmt: skip
    """Whether the kernel compiles itself on the prompt's pass or, without the cache, on the next pass (one
    token longer): seconds of silence, said beforehand. The kernel answers for a pass (``compiles_for``)."""
    lengths = [prompt_len] + ([prompt_len + 1] if not use_cache and max_new_tokens > 1 else [])
    return any(kernel.compiles_for(n, n, masks) for n in lengths)


def run(cfg: SampleConfig) -> list[str]:
    """Generate ``num_samples`` continuations, streaming them to stdout; returns them."""
    check(cfg)
    device = resolve_device(cfg.device, option="device")
    dtype = resolve_dtype(cfg.dtype, device, option="dtype")
    prompt = read_prompt(cfg)  # a missing or unreadable prompt file is named before the model loads
    loaded = load_model(cfg.source, cfg.attention, cfg.kernel)
    model, tokenizer = loaded.model.to(device).eval(), loaded.tokenizer
    ids = prompt_ids(prompt, tokenizer, model.config.block_size)
    if cfg.past_context == "full":  # every earlier key, up to the generation's last token (its KV cache too)
        try:
            model = with_context(model, len(ids) + cfg.max_new_tokens, "full").eval()
        except ValueError as err:
            raise ValueError(f"past_context=full: {err}") from None
    top_k = cfg.top_k
    if top_k is not None and top_k > model.config.vocab_size:
        notice(f"top_k={top_k} is larger than the vocabulary ({model.config.vocab_size}): no limit")
        top_k = None
    if dtype != torch.float32:
        model = model.to(dtype)  # cast the weights once: every token then reads half the bytes
    if cfg.compile:
        inductor_cache_per_cpu_capability()
    # Sample i has its own generator (seed + i): the same text whether generated alone or in a batch.
    generators = [torch.Generator().manual_seed(cfg.seed + i) for i in range(cfg.num_samples)]
    decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in generators]  # tokens split chars
    prefix = "" if ids == [tokenizer.eot_id] else tokenizer.decode_bytes(ids).decode("utf-8", errors="replace")
    texts = [prefix] * cfg.num_samples
    counts = [0] * cfg.num_samples
    kernel = registry.kernel(model.config.kernel)
    masks = model.config.attention_spec.masks  # the model's masks (a schedule's first layer's are as telling)
    if compiles_before_first_tokens(kernel, masks, len(ids), cfg.use_cache, cfg.max_new_tokens):
        notice(f"kernel={kernel.name}: compiling the kernel for this length (first call only: 18 s on a 2-core CPU, "
               f"5 s once torch's compile cache holds it; docs/attention.md)"
               f"{'' if cfg.use_cache else ', and once more for the next length'}")
    start_up_over()  # the tokens begin
    if cfg.num_samples > 1:
        print(f"--- sample 1/{cfg.num_samples} ---", flush=True)
    print(prefix, end="", flush=True)  # the first sample streams; the others are printed when all are done
    decoding = choose_decoding("compiled" if cfg.compile else "auto", device)
    # When each step's tokens are on the host (every step syncs with the device), and how many came.
    marks: list[tuple[float, int]] = [(time.perf_counter(), 0)]
    load = OthersLoad()  # the cores other processes use meanwhile: a busy machine's rate is not the model's
    for step in generate_batch(model, ids, cfg.max_new_tokens, generators, cfg.temperature, top_k, cfg.top_p,
                               use_cache=cfg.use_cache, stop_id=tokenizer.eot_id, decoding=decoding):  # fmt: skip
        if len(marks) < 3:  # the first token (the prompt's pass), then the first decode step (its set-up)
            marks.append((time.perf_counter(), sum(token is not None for token in step)))
        for i, token in enumerate(step):
            if token is None:
                continue
            counts[i] += 1
            if token == tokenizer.eot_id:
                continue
            piece = decoders[i].decode(tokenizer.decode_bytes([token]))
            texts[i] += piece
            if i == 0:
                print(piece, end="", flush=True)
    end = (time.perf_counter(), sum(counts) - sum(n for _, n in marks))
    while len(marks) < 3:  # a generation of one step (or none): no decode step to time
        marks.append((end[0], 0))
    marks.append(end)
    texts = [text + decoder.decode(b"", final=True) for text, decoder in zip(texts, decoders)]
    print(flush=True)
    for i, text in enumerate(texts[1:], 2):
        print(f"--- sample {i}/{cfg.num_samples} ---\n{text}", flush=True)
    if marks[1][1]:  # a first token came
        report_speed(cfg, model.config, len(ids), marks, device, dtype, decoding, weight_bytes(model),
                     load.since_start())  # fmt: skip
    return texts


def report_speed(cfg: SampleConfig, model: GPTConfig, prompt_tokens: int, marks: list[tuple[float, int]],
                 device: torch.device, dtype: torch.dtype, decoding: str,
                 weights: int | None = None, others: float | None = None) -> None:  # fmt: skip
    """Time to the first token (the prompt's pass) apart from the rate of the tokens after it: the decode rate
    a benchmark of the same call measures. ``marks``: (time, tokens) at the start, after the first step,
    after the second and at the end. A first decode step that compiles or captures a graph (or, without the
    cache, compiles flex for a new length) is said on its own, not averaged into the rate. With the cache and
    the ``weights``' bytes, the rate's share of the memory-bandwidth limit follows (``bandwidth_share``); on a busy
    machine (``others``: the cores other processes used meanwhile), a caution with what to do."""
    (start, _), (first, _), (second, second_tokens), (end, rest_tokens) = marks
    steps_after = max(1, math.ceil(rest_tokens / cfg.num_samples))
    setup = second - first
    parts = [f"first token after {first - start:.2f} s ({prompt_tokens}-token prompt)"]
    if rest_tokens and setup > max(0.25, 10 * (end - second) / steps_after):
        parts.append(f"the next after {setup:.2f} s (setting up the decode step: compilation or graph capture)")
        decoded, seconds, skipped = rest_tokens, end - second, 2  # the prompt's step and the set-up step
    else:
        decoded, seconds, skipped = second_tokens + rest_tokens, end - first, 1
    rate = decoded / max(seconds, 1e-9)
    if decoded:
        parts.append(f"then {decoded} tokens in {seconds:.2f} s: {rate:.1f} tokens/s")
    how = (f"{attention_label(vars(model))}, {'with' if cfg.use_cache else 'without'} {kept_between_tokens(model)}, "
           f"{device}, {str(dtype).removeprefix('torch.')}, {cfg.num_samples} "
           f"sample{'s' if cfg.num_samples > 1 else ''} at once" + (f", {decoding} decoding" if cfg.use_cache else ""))
    share = ""
    if decoded and cfg.use_cache and weights is not None:
        steps = math.ceil(decoded / cfg.num_samples)
        keys = context_lengths(model, prompt_tokens, skipped + steps)[skipped:]
        share = f"; {bandwidth_share(rate, model, weights, cfg.num_samples, keys, dtype, device)}"
    notice(f"{'; '.join(parts)} ({how}){share}{busy_caution(others, device)}")


def busy_caution(others: float | None, device: torch.device) -> str:
    """What a rate measured on a busy machine needs said: the others' use, and that torch's threads, each waiting
    for the slowest at every product, make a shared CPU many times slower (15 against 281 tokens/s on 2 cores)."""
    if not is_busy(others):
        return ""
    threads = f"; torch's {torch.get_num_threads()} threads slow down most on shared cores: OMP_NUM_THREADS=1, or " \
              f"fewer processes at once" if device.type == "cpu" and torch.get_num_threads() > 1 else ""
    return f" (the machine was busy: {busy_text(others)}, so this rate is not the model's{threads})"


def kept_between_tokens(model: GPTConfig) -> str:
    """What decoding keeps from one token to the next: a KV cache (softmax attention's layers), a recurrent state
    (linear layers: attention=gated_deltanet), or both (a schedule of both kinds)."""
    kinds = {"KV cache": any(model.cache_widths), "recurrent state": model.state_bytes(4) > 0}
    return " and ".join(kind for kind, kept in kinds.items() if kept)


@hydra.main(version_base="1.3", config_path="configs", config_name="sample")
def main(cfg: DictConfig) -> None:
    with user_errors(USAGE):
        run(with_layout_options(OmegaConf.to_object(cfg)))


if __name__ == "__main__":
    refuse_renamed_options({"layout": "attention"})
    take_layout_options()
    take_text_options()  # a prompt is any text: Hydra's grammar would refuse code (parentheses, commas)
    check_overrides("sample", "python sample.py")
    main()
