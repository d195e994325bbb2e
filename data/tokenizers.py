"""Tokenizers, all tiktoken encodings: OpenAI's BPEs and an offline byte-level one."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import tiktoken

from common.choices import lookup

EOT = "<|endoftext|>"
# GPT-2's pre-tokenisation pattern: it only splits text into pieces, so any byte-level encoding can use it.
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _bytes_encoding() -> tiktoken.Encoding:
    """256 single-byte tokens + <|endoftext|> (id 256): needs no download."""
    return tiktoken.Encoding(
        name="bytes",
        pat_str=_GPT2_PATTERN,
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={EOT: 256},
    )


class TokenizerUnavailable(RuntimeError):
    """A tokenizer whose rank file tiktoken could not download (offline): ``name``, and why (``reason``)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(
            f"tokenizer {name!r} needs its rank file, which tiktoken downloads once (it could not: {reason}); run "
            f"once with network access, or set TIKTOKEN_CACHE_DIR to a folder holding the rank file (it looked in "
            f"{tiktoken_cache_dir()}); offline, data.tokenizer=bytes needs no download"
        )


def _downloaded(name: str, encoding: str | None = None):
    """A tiktoken encoding by name; ``encoding`` loads another tiktoken encoding with the same tokens."""

    def load() -> tiktoken.Encoding:
        try:
            return tiktoken.get_encoding(encoding or name)
        except Exception as err:  # requests/urllib errors when the rank file cannot be fetched
            raise TokenizerUnavailable(name, type(err).__name__) from err

    return load


def tiktoken_cache_dir() -> str:
    """Where tiktoken keeps downloaded rank files (its own rule: TIKTOKEN_CACHE_DIR, DATA_GYM_CACHE_DIR, tmp)."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return os.environ[variable] or "nowhere: caching is off"
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


TOKENIZERS = {
    "bytes": _bytes_encoding,
    # tiktoken's r50k_base has GPT-2's ranks, pattern and <|endoftext|> id exactly, in one
    # rank file (its "gpt2" reads the same ranks from two files in the original GPT-2 format).
    "gpt2": _downloaded("gpt2", encoding="r50k_base"),
    "r50k_base": _downloaded("r50k_base"),
    "cl100k_base": _downloaded("cl100k_base"),
    "o200k_base": _downloaded("o200k_base"),
}


GPT2_IDS = ("gpt2", "r50k_base")  # two names of one tokenizer: GPT-2's token ids

# Vocabulary sizes (tiktoken's n_vocab), so a run can be planned before any rank file is downloaded.
VOCAB_SIZES = {"bytes": 257, "gpt2": 50257, "r50k_base": 50257, "cl100k_base": 100277, "o200k_base": 200019}
# Each one's end-of-text id (tiktoken's <|endoftext|>): what ends a document, for document masking's plan
EOT_IDS = {"bytes": 256, "gpt2": 50256, "r50k_base": 50256, "cl100k_base": 100257, "o200k_base": 199999}


class Tokenizer:
    """A tiktoken encoding with the facts training needs: vocabulary size and EOT id."""

    def __init__(self, name: str, encoding: tiktoken.Encoding) -> None:
        self.name = name
        self.encoding = encoding
        self.eot_id = encoding.encode_single_token(EOT)
        self.vocab_size = encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        """Text -> ids; special-token strings in the text are treated as plain text."""
        return self.encoding.encode_ordinary(text)

    def encode_array(self, text: str) -> np.ndarray:
        """Text -> uint32 ids as a numpy array, straight from tiktoken's buffer (no Python list);
        special-token strings are plain text, as in ``encode``."""
        return self.encoding.encode_to_numpy(text, allowed_special=set(), disallowed_special=())


    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)

    def decode_bytes(self, ids: list[int]) -> bytes:
        return self.encoding.decode_bytes(ids)


def get_tokenizer(name: str) -> Tokenizer:
    """A tokenizer by name: bytes, gpt2, r50k_base, cl100k_base, o200k_base."""
    return Tokenizer(name, lookup(TOKENIZERS, "tokenizer", name)())
