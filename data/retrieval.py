"""Synthetic retrieval, generated offline: a fact placed at a chosen depth of a sequence, asked for at its end.

- ``passkey`` (Mohtashami & Jaggi, 2023): a five-digit pass key hidden in the paper's filler text ("The grass is
  green. ..."), then asked for: ``... The pass key is 68351. ... The pass key is`` -> `` 68351``.
- ``mqar``, multi-query associative recall (Zoology, Arora et al., 2023) written as text: pairs ``xqa=37`` one
  after another, then several keys asked again (``xqa=`` -> ``37``), the asked pairs sitting at the depth.

Depth is where the fact sits: 0 at the start of the sequence, 1 just before the question. Each piece of text is
encoded alone and the ids joined, so the fact's ids and the answer's are the same ids in any tokenizer and the
answer's place is known exactly. Every example is drawn from a generator seeded by (task, seed, length, depth,
index): the same arguments give the same examples on every machine.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUERIES = 4  # mqar: keys asked per sequence
KEY_LETTERS = 3  # mqar: a key is three lowercase letters (17,576 keys)

Encode = Callable[[str], list[int]]


class TooShort(ValueError):
    """A length too short for a task: what the task needs (``needed`` tokens, for ``what``), and the length."""

    def __init__(self, task: str, needed: int, what: str, length: int) -> None:
        super().__init__(f"{task} needs at least {needed} tokens ({what}), got length {length}; use longer lengths")
        self.task, self.needed, self.what = task, needed, what


@dataclass(frozen=True)
class Example:
    """``tokens``, the model's whole input; ``answers``, the [start, end) spans of ids it must predict, each
    from the ids before it (a span counts as right when every id of it is the model's top choice)."""

    tokens: list[int]
    answers: list[tuple[int, int]]


def filler(encode: Encode, count: int) -> tuple[list[int], list[int]]:
    """``count`` ids of the filler text, its sentences repeated and the first cut to fit, and the places a
    sentence may go: its start, between two sentences, its end."""
    sentences = sentence_ids(encode)
    ids: list[int] = []
    ends = [0]
    while len(ids) < count:
        for sentence in sentences:
            ids += sentence
            ends.append(len(ids))
    cut = len(ids) - count
    return ids[cut:], [0] + [end - cut for end in ends if end > cut]


def sentence_ids(encode: Encode) -> list[list[int]]:
    """The filler's sentences, each encoded alone with the space after it."""
    return [encode(sentence + ". ") for sentence in FILLER.rstrip(". ").split(". ")]


def passkey(encode: Encode, length: int, depth: float, rng: random.Random) -> Example:
    """Filler with ``The pass key is <key>.`` between two of its sentences, the place nearest ``depth``,
    ending with ``The pass key is`` and the key."""
    key = f" {rng.randrange(10_000, 100_000)}"
    lead, answer, stop = encode("The pass key is"), encode(key), encode(". ")
    needle = lead + answer + stop
    room = length - len(needle) - len(lead) - len(answer)
    if room < 0:
        raise TooShort("passkey", length - room, "the key's sentence and the question", length)
    text, places = filler(encode, room)
    before = min(places, key=lambda place: abs(place - depth * room))
    tokens = text[:before] + needle + text[before:] + lead + answer
    return Example(tokens, [(length - len(answer), length)])


def mqar_keys(rng: random.Random):
    """Distinct three-letter keys in an order of ``rng``'s, until all are used."""
    seen: set[int] = set()
    while len(seen) < 26**KEY_LETTERS:
        number = rng.randrange(26**KEY_LETTERS)
        if number not in seen:
            seen.add(number)
            yield "".join(string.ascii_lowercase[number // 26**p % 26] for p in range(KEY_LETTERS))


def mqar(encode: Encode, length: int, depth: float, rng: random.Random) -> Example:
    """Pairs `` key=value`` (two-digit values) filling the sequence, then ``QUERIES`` of them asked again, in a
    shuffled order: the asked pairs are consecutive, starting at ``depth`` of the pairs. Filler ids pad the
    start to the exact length."""
    pairs: list[tuple[list[int], list[int]]] = []
    longest, used = 0, 0
    for key in mqar_keys(rng):
        pair = (encode(f" {key}="), encode(f"{rng.randrange(100):02d}"))
        size = len(pair[0]) + len(pair[1])
        if used + size + QUERIES * max(longest, size) > length:
            break
        pairs.append(pair)
        used, longest = used + size, max(longest, size)
    if len(pairs) < QUERIES:
        needed = 2 * QUERIES * (longest or len(encode(" abc=12")))
        raise TooShort("mqar", needed, f"{QUERIES} pairs and their {QUERIES} questions", length)
    first = round(depth * (len(pairs) - QUERIES))
    asked = list(range(first, first + QUERIES))
    rng.shuffle(asked)
    body = [t for key, value in pairs for t in key + value]
    questions, spans = [], []
    start = length - sum(len(pairs[i][0]) + len(pairs[i][1]) for i in asked)
    for i in asked:
        key, value = pairs[i]
        questions += key + value
        spans.append((start + len(questions) - len(value), start + len(questions)))
    pad = filler(encode, start - len(body))[0]
    return Example(pad + body + questions, spans)


TASKS: dict[str, Callable[[Encode, int, float, random.Random], Example]] = {"passkey": passkey, "mqar": mqar}


def check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"no retrieval task {task!r}; choose from: {', '.join(TASKS)} (passkey: a number hidden "
                         f"in filler text; mqar: multi-query associative recall)")  # fmt: skip


def check_depth(depth) -> None:
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
        raise ValueError(f"depth {depth!r} must be a number from 0 (the sequence's start) to 1 (just before the "
                         f"question)")  # fmt: skip


def usable_lengths(tasks: list[str], encode: Encode, lengths: list[int],
                   option: str) -> tuple[dict[str, list[int]], str | None]:  # fmt: skip
    """Each task's lengths long enough for it, and one line saying which were skipped and why (None: none
    were). Refused (``option``: the option as typed) only where no task fits any length: nothing to score."""
    usable: dict[str, list[int]] = {}
    skipped: list[str] = []
    first_refusal = None
    for task in tasks:
        check_task(task)
        short = []
        for length in lengths:
            try:
                TASKS[task](encode, length, 0.0, random.Random(0))
                usable.setdefault(task, []).append(length)
            except TooShort as err:
                short.append((length, err))
        if short:
            first_refusal = first_refusal or short[-1][1]
            named = ", ".join(str(length) for length, _ in short)
            skipped.append(f"{task} skips length{'s' * (len(short) > 1)} {named} (it needs at least "
                           f"{short[0][1].needed} tokens: {short[0][1].what})")  # fmt: skip
    if not usable:
        raise ValueError(f"{option}: {first_refusal}")
    line = f"retrieval: {'; '.join(skipped)}; every other length is scored" if skipped else None
    return usable, line


def examples(task: str, encode: Encode, length: int, depth: float, count: int, seed: int) -> list[Example]:
    """``count`` examples of ``task`` at ``length`` tokens and ``depth``, the same for the same arguments."""
    check_task(task)
    check_depth(depth)
    return [TASKS[task](encode, length, depth, random.Random(f"{task}:{seed}:{length}:{float(depth)}:{i}"))
            for i in range(count)]  # fmt: skip


# data=retrieval: documents of both tasks to train on, each a whole example (data/sources.py). Version 1: bump
# it when a generator's text changes, so prepared copies are remade.
CORPUS_VERSION = 1
CORPUS_DOCUMENTS = 40_000
CORPUS_LENGTHS = {"passkey": (48, 96), "mqar": (56, 96)}  # bytes, drawn evenly: around a nano model's context


def corpus(documents: int = CORPUS_DOCUMENTS, seed: int = 0) -> list[str]:
    """``documents`` texts, the two tasks in turn, each at a length and depth drawn from its own generator."""
    def encode(text: str) -> list[int]:
        return list(text.encode())

    texts = []
    for i in range(documents):
        task = list(TASKS)[i % len(TASKS)]
        rng = random.Random(f"corpus:{seed}:{i}")
        length = rng.randint(*CORPUS_LENGTHS[task])
        texts.append(bytes(TASKS[task](encode, length, rng.random(), rng).tokens).decode())
    return texts
