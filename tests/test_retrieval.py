"""Synthetic retrieval (data/retrieval.py) and its scoring (training/retrieval.py).

- the generators are deterministic for their arguments, every example is exactly its length, and each answer
  is where the example says: the pass key's sentence holds the asked key, at the sentence boundary nearest the
  depth; each mqar answer is the value its key was paired with, the asked pairs consecutive at the depth;
  across lengths from a task's minimum to past a nano context, odd and prime ones, in bytes and GPT-2's BPE;
- the scorer counts an answer right exactly when every id of it is the top choice (a model that reads the next
  id off its input scores all, one wrong id in an answer loses that answer), however the batch is cut;
- data=retrieval's documents are the tasks' examples, the same on every call.

evaluate.py's retrieval (JSON, table, heatmap): test_long_context.py; its refusals: test_bad_inputs.py.
"""

from __future__ import annotations

import random
import re

import pytest
import torch

from data.retrieval import (
    CORPUS_LENGTHS,
    FILLER,
    QUERIES,
    TASKS,
    corpus,
    examples,
    filler,
    usable_lengths,
)
from data.tokenizers import get_tokenizer
from training.retrieval import accuracy

BYTES = get_tokenizer("bytes")
LENGTHS = [44, 45, 47, 53, 64, 97, 128, 131, 251, 256, 509, 1024]  # 44: the passkey's shortest in bytes
DEPTHS = [0, 0.1, 0.25, 0.5, 0.77, 1]


def decoded(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids))


@pytest.mark.parametrize("task", list(TASKS))
def test_the_same_arguments_give_the_same_examples_and_another_seed_others(task):
    first = examples(task, BYTES.encode, 128, 0.5, 6, seed=3)
    assert first == examples(task, BYTES.encode, 128, 0.5, 6, seed=3)
    assert first != examples(task, BYTES.encode, 128, 0.5, 6, seed=4)
    assert len({tuple(e.tokens) for e in first}) == 6, "each example of a cell is its own"


def check_passkey(tokenizer, length: int, depth: float) -> None:
    for example in examples("passkey", tokenizer.encode, length, depth, 3, seed=0):
        assert len(example.tokens) == length
        [(start, end)] = example.answers
        assert end == length
        key = decoded(tokenizer, example.tokens[start:end])
        assert re.fullmatch(r" \d{5}", key), key
        text = decoded(tokenizer, example.tokens)
        needle = f"The pass key is{key}. "
        assert text.count(needle) == 1 and text.endswith(f"The pass key is{key}")
        # the sentence sits at the boundary of filler sentences nearest depth x the filler's tokens
        lead, stop = tokenizer.encode("The pass key is"), tokenizer.encode(". ")
        room = length - 2 * len(lead) - 2 * (end - start) - len(stop)
        ids, places = filler(tokenizer.encode, room)
        before = min(places, key=lambda place: abs(place - depth * room))
        assert example.tokens[:before] == ids[:before]
        assert decoded(tokenizer, example.tokens[before:]).startswith(needle)


def check_mqar(tokenizer, length: int, depth: float) -> None:
    for example in examples("mqar", tokenizer.encode, length, depth, 3, seed=0):
        assert len(example.tokens) == length and len(example.answers) == QUERIES
        matches = re.findall(r" ([a-z]{3})=(\d\d)", decoded(tokenizer, example.tokens))
        pairs = matches[:-QUERIES]  # then the questions
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)) >= QUERIES, "every key once"
        value_of = dict(pairs)
        asked = []
        for start, end in example.answers:
            question = decoded(tokenizer, example.tokens[:start])
            key = re.search(r" ([a-z]{3})=$", question).group(1)
            assert decoded(tokenizer, example.tokens[start:end]) == value_of[key]
            asked.append(keys.index(key))
        first = round(depth * (len(keys) - QUERIES))
        assert sorted(asked) == list(range(first, first + QUERIES))
        assert example.answers[-1][1] == length


@pytest.mark.parametrize("length", LENGTHS)
def test_each_passkey_is_its_length_with_the_key_at_its_depth_in_bytes(length):
    for depth in DEPTHS:
        check_passkey(BYTES, length, depth)


@pytest.mark.parametrize("length", [n for n in LENGTHS if n >= 2 * QUERIES * 7])  # mqar's shortest: 56 bytes
def test_each_mqar_is_its_length_with_each_value_its_keys_in_bytes(length):
    for depth in DEPTHS:
        check_mqar(BYTES, length, depth)


def test_both_tasks_hold_in_gpt2_bpe(gpt2_tokenizer_offline):
    for length in (40, 53, 97, 256, 1031):
        for depth in (0, 0.3, 1):
            check_passkey(gpt2_tokenizer_offline, length, depth)
            check_mqar(gpt2_tokenizer_offline, length, depth)


@pytest.mark.parametrize("task, shortest", [("passkey", 44), ("mqar", 56)])
def test_a_length_too_short_for_a_task_is_skipped_or_refused_naming_its_minimum(task, shortest):
    assert usable_lengths([task], BYTES.encode, [shortest], option="lengths=[...]") == ({task: [shortest]}, None)
    usable, skipped = usable_lengths([task], BYTES.encode, [shortest - 1, shortest], option="lengths=[...]")
    assert usable == {task: [shortest]}
    assert skipped.startswith(f"retrieval: {task} skips length {shortest - 1} (it needs at least {shortest} tokens")
    with pytest.raises(ValueError) as err:  # no length to score: refused
        usable_lengths([task], BYTES.encode, [shortest - 1], option=f"lengths=[{shortest - 1}]")
    message = str(err.value)
    assert message.startswith(f"lengths=[{shortest - 1}]: {task} needs at least {shortest} tokens"), message
    assert "\n" not in message


class ReadsAhead(torch.nn.Module):
    """A model that gives the next id of its input as its top choice (it sees the whole input): every answer
    is right; ``wrong`` ids of the input (a set of positions) get another top choice."""

    def __init__(self, vocab: int, wrong: set[int] = frozenset()) -> None:
        super().__init__()
        self.vocab, self.wrong = vocab, wrong
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, x, targets):
        self.shapes.append(tuple(x.shape))
        upcoming = torch.cat([x[:, 1:], x[:, :1]], dim=1)  # position t's top choice: the id at t + 1
        for position in self.wrong:
            upcoming[:, position - 1] = (upcoming[:, position - 1] + 1) % self.vocab
        return torch.nn.functional.one_hot(upcoming, self.vocab).float(), None


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("batch_tokens", [1, 200, 10_000])
def test_an_answer_is_right_when_every_id_of_it_is_the_top_choice(task, batch_tokens):
    cases = examples(task, BYTES.encode, 100, 0.5, 5, seed=1)
    per_case = len(cases[0].answers)
    reader = ReadsAhead(BYTES.vocab_size)
    assert accuracy(reader, cases, batch_tokens, torch.device("cpu"), torch.float32) == (5 * per_case, 5 * per_case)
    per_batch = max(1, batch_tokens // 100)
    assert reader.shapes == [(min(per_batch, 5 - i), 100) for i in range(0, 5, per_batch)], \
        "whole sequences, at most batch_tokens ids per forward (one at least)"
    # one id wrong inside the first answer (its last) and one before any answer: one answer lost
    start, end = cases[0].answers[0]
    wrong = ReadsAhead(BYTES.vocab_size, wrong={end - 1, 3})
    assert accuracy(wrong, cases, batch_tokens, torch.device("cpu"), torch.float32) == (
        5 * per_case - 5, 5 * per_case)  # fmt: skip


def test_the_training_corpus_is_the_tasks_examples_the_same_every_time():
    texts = corpus(documents=40, seed=2)
    assert texts == corpus(documents=40, seed=2) and texts != corpus(documents=40, seed=3)
    for i, text in enumerate(texts):
        task = list(TASKS)[i % len(TASKS)]
        low, high = CORPUS_LENGTHS[task]
        assert low <= len(text.encode()) <= high
        rng = random.Random(f"corpus:2:{i}")
        length = rng.randint(low, high)
        assert text.encode() == bytes(TASKS[task](lambda s: list(s.encode()), length, rng.random(), rng).tokens)
    assert all("The pass key is" in t for t in texts[::2]) and all("=" in t for t in texts[1::2])
    assert any(sentence in "".join(texts) for sentence in FILLER.split(". "))

