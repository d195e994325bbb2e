"""Retrieval accuracy against length and depth (``data/retrieval.py``'s tasks): does the model's top choice
give back the fact it read ``depth`` of the way into a sequence of ``length`` tokens?"""

from __future__ import annotations

import torch

from data.retrieval import Example, examples
from model.device import autocast
from training.evaluate import out_of_memory_named


@torch.no_grad()
def accuracy(model: torch.nn.Module, cases: list[Example], batch_tokens: int, device: torch.device,
             dtype: torch.dtype) -> tuple[int, int]:  # fmt: skip
    """(right, asked): the answers whose every id is the model's top choice given the ids before it, over
    ``cases`` of one length, at most ``batch_tokens`` ids per forward (whole sequences, at least one)."""
    was_training = model.training
    model.eval()
    length = len(cases[0].tokens)
    per_batch = max(1, batch_tokens // length)
    right = asked = 0
    for first in range(0, len(cases), per_batch):
        batch = cases[first : first + per_batch]
        ids = torch.tensor([case.tokens for case in batch], dtype=torch.long)
        x = ids.to(device)
        targets = torch.full_like(x, -1)  # every logit, and no loss to speak of
        with autocast(device, dtype), out_of_memory_named(model, x.shape, "lengths"):
            logits = model(x, targets)[0]
        guesses = logits.argmax(-1).cpu()  # position t's guess is the id at t + 1
        for row, case in enumerate(batch):
            for start, end in case.answers:
                right += bool((guesses[row, start - 1 : end - 1] == ids[row, start:end]).all())
                asked += 1
    model.train(was_training)
    return right, asked


def retrieval_rows(model: torch.nn.Module, encode, tasks: list[str], lengths: list[int], depths: list[float],
                   past_context: str, count: int, seed: int, batch_tokens: int, device: torch.device,
                   dtype: torch.dtype, progress: bool = False,
                   usable: dict[str, list[int]] | None = None) -> list[dict]:  # fmt: skip
    """One row per task x length x depth: ``count`` examples' accuracy, the model read by ``past_context``'s
    rule past its block size (evaluate.py's JSON, its heatmap). ``usable``: each task's lengths, where some are
    too short for it (``data/retrieval.py``'s ``usable_lengths``); by default every length."""
    from tqdm import tqdm

    from model.decoding.context import with_context

    usable = usable or {task: lengths for task in tasks}
    rows = []
    cells = [(length, task) for length in lengths for task in tasks if length in usable.get(task, ())]
    bar = tqdm(total=len(cells) * len(depths), desc="retrieval", unit="cell", disable=not progress, leave=False)
    for length in dict.fromkeys(length for length, _ in cells):
        reader = with_context(model, length, past_context)
        for task in (task for at, task in cells if at == length):
            for depth in depths:
                cases = examples(task, encode, length, depth, count, seed)
                right, asked = accuracy(reader, cases, batch_tokens, device, dtype)
                rows.append({"task": task, "length": length, "multiple": length / model.config.block_size,
                             "depth": depth, "past_context": past_context, "examples": count, "seed": seed,
                             "right": right, "asked": asked, "accuracy": right / asked})  # fmt: skip
                bar.update()
    bar.close()
    return rows
