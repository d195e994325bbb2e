"""GPT-2's tokenizer files for ``transformers`` (``vocab.json`` + ``merges.txt``), rebuilt from tiktoken's ranks.

tiktoken stores each token's bytes and rank; GPT-2's original files store the
tokens as printable strings (each byte mapped to one unicode character) and
the merges in rank order. Every merge is recovered by running BPE on a token
with only the lower ranks: it stops at exactly the two parts that merge into it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from data.tokenizers import EOT, GPT2_IDS, Tokenizer

# The files write_hf_gpt2_tokenizer writes.
HF_GPT2_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _as_text(token: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in token)


def _split(token: bytes, ranks: dict[bytes, int], below: int) -> list[bytes]:
    """BPE on ``token`` using only merges ranked below ``below``."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_rank = None, below
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best is None:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def gpt2_vocab_and_merges(tokenizer: Tokenizer) -> tuple[dict[str, int], list[str]]:
    encoding = tokenizer.encoding
    ranks = {encoding.decode_single_token_bytes(i): i for i in range(encoding.n_vocab) if i != tokenizer.eot_id}
    vocab = {_as_text(token): rank for token, rank in ranks.items()}
    vocab[EOT] = tokenizer.eot_id
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            left, right = _split(token, ranks, rank)
            merges.append(f"{_as_text(left)} {_as_text(right)}")
    return vocab, merges


def write_hf_gpt2_tokenizer(tokenizer: Tokenizer, folder: Path, max_length: int) -> list[Path]:
    """Files that ``transformers.AutoTokenizer.from_pretrained(folder)`` reads as GPT-2's tokenizer."""
    if tokenizer.name not in GPT2_IDS:
        raise ValueError(f"tokenizer {tokenizer.name!r} has no GPT-2 files; only {', '.join(GPT2_IDS)} do")
    vocab, merges = gpt2_vocab_and_merges(tokenizer)
    files = {
        "vocab.json": json.dumps(vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
        "tokenizer_config.json": json.dumps({
            "tokenizer_class": "GPT2Tokenizer", "model_max_length": max_length, "add_prefix_space": False,
            "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
        }, indent=2),  # fmt: skip
        "special_tokens_map.json": json.dumps({"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}, indent=2),
    }
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return [folder / name for name in files]
