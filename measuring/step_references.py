"""bench_reference.py train-step, levers and optimizer: headlab's training step against
transformers' GPT-2, against itself without a lever of issue 53 (the head and loss in chunks, a compile mode), and
with Muon against with AdamW."""

from __future__ import annotations

import torch

from measuring.side_by_side import hf_twin, interleave, report
from model import GPT, GPTConfig
from model.compiling import compile_for_training
from model.device import autocast, device_name, inductor_cache_per_cpu_capability, resolve_device, resolve_dtype
from training.config import OptimConfig
from training.optim import fused_adamw, make_optimizer


def train_step(args) -> None:
    """A whole training step (forward, backward, clipping, AdamW) of the same model and weights, as training
    runs it on the device: autocast in ``--dtype``, fused AdamW, optionally both sides compiled."""
    device = resolve_device(args.device, option="--device")
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as training does
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, attention=args.attention, kernel=args.kernel)  # fmt: skip
    ours = GPT(config)
    hf = hf_twin(ours).to(device)
    ours = ours.to(device)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]

    def make_step(model, loss_of):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                fused=fused_adamw(device))  # fmt: skip
        run = torch.compile(model) if args.compile else model

        def step():
            for _ in range(args.steps):
                with autocast(device, dtype):
                    loss = loss_of(run)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)

        return step

    if args.compile:
        inductor_cache_per_cpu_capability()
    ours_step = make_step(ours, lambda m: m(x, y)[1])
    theirs_step = make_step(hf, lambda m: torch.nn.functional.cross_entropy(
        m(input_ids=x).logits.reshape(-1, args.vocab).float(), y.reshape(-1)))  # fmt: skip
    ours_step(), theirs_step()  # warm-up (and compilation)
    a, b = interleave(ours_step, theirs_step, args.rounds)
    tokens = args.steps * args.batch * args.seq
    report(f"training step ({args.attention}/{args.kernel}, batch {args.batch} x {args.seq}, {args.n_layer} layers x "
           f"{args.n_embd}, vocab {args.vocab}, {device_name(device)}, {str(dtype).removeprefix('torch.')}"
           f"{', compiled' if args.compile else ''})", a, b, tokens, "tokens/s", comparison="train-step")  # fmt: skip


def lever_step(args) -> None:
    """A lever of issue 53 measured on headlab's own training step (forward, backward, clipping, AdamW; train-step's
    weights, batch and optimizer): the step with ``--loss-chunk`` (the head and loss in chunks) and/or compiled in
    ``--compile-mode`` against the same step without them (the whole logits; compiled in the default mode where
    either side compiles), interleaved; on CUDA each side's peak memory too."""
    device = resolve_device(args.device, option="--device")
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, attention=args.attention, kernel=args.kernel)  # fmt: skip
    models = [GPT(config).to(device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    models[0].loss_chunk = args.loss_chunk
    compiled = args.compile or args.compile_mode != "default"
    modes = (args.compile_mode, "default")
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]
    peaks = [0, 0]

    def make_step(side: int):
        model = models[side]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adamw(device))
        run = compile_for_training(model, "model", modes[side]) if compiled else model

        def step():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for _ in range(args.steps):
                if modes[side] == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                with autocast(device, dtype):
                    loss = run(x, y)[1]
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                peaks[side] = max(peaks[side], torch.cuda.max_memory_allocated(device))

        return step

    levers, plain = make_step(0), make_step(1)
    levers(), plain()  # warm-up (and compilation)
    a, b = interleave(levers, plain, args.rounds)
    said = [(f"the head and loss in chunks of {args.loss_chunk} tokens", "the whole logits")] if args.loss_chunk else []
    said += [(f"inductor's mode {args.compile_mode}", "the default mode")] if args.compile_mode != "default" else []
    lever = " and ".join(w for w, _ in said) or "no lever (the same step twice)"
    against = " and ".join(a for _, a in said) or "itself"
    memory = (f"; peak memory {peaks[0] / 2**30:.2f} GiB against {peaks[1] / 2**30:.2f} GiB"
              if device.type == "cuda" else "")
    report(f"training step with {lever} (reference: {against}; batch {args.batch} x {args.seq}, {args.n_layer} "
           f"layer{'s' if args.n_layer > 1 else ''} x {args.n_embd}, vocab {args.vocab}, {device_name(device)}, "
           f"{str(dtype).removeprefix('torch.')}"
           f"{', compiled' if compiled else ''}){memory}", a, b, args.steps * args.batch * args.seq, "tokens/s",
           comparison="levers", lever=lever, against=against, loss_chunk=args.loss_chunk,
           compile_mode=args.compile_mode,
           peak_bytes=peaks[0] or None, reference_peak_bytes=peaks[1] or None)  # fmt: skip


def optimizer_step(args) -> None:
    """Muon (``optim=muon``, its matrices split as ``--split`` says) against AdamW (``optim=adamw``), each the trainer's
    own optimizer for a run in ``--dtype`` (Muon orthogonalises in bfloat16 for a bf16 run, float32 for a float32 one),
    on train-step's model and batch: the whole training step (forward, backward, clipping, the optimizer) and the
    optimizer's step alone (on fixed gradients), each interleaved."""
    device = resolve_device(args.device, option="--device")
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, attention=args.attention, kernel=args.kernel)  # fmt: skip
    models = [GPT(config).to(device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    settings = (OptimConfig(name="muon", muon_split=args.split), OptimConfig())
    optimizers = [make_optimizer(model, cfg, device, dtype) for model, cfg in zip(models, settings)]
    runs = [compile_for_training(model, "block", "default") if args.compile else model for model in models]
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]

    def whole(side: int):
        def step():
            for _ in range(args.steps):
                with autocast(device, dtype):
                    loss = runs[side](x, y)[1]
                loss.backward()
                torch.nn.utils.clip_grad_norm_(models[side].parameters(), 1.0)
                optimizers[side].step()
                optimizers[side].zero_grad(set_to_none=True)

        return step

    def alone(side: int):
        def step():
            for _ in range(args.steps):
                optimizers[side].step()

        return step

    whole(0)(), whole(1)()  # warm-up (and compilation): the optimizers' state made
    shape = (f"{args.attention}, batch {args.batch} x {args.seq}, {args.n_layer} layers x {args.n_embd}, vocab "
             f"{args.vocab}, {device_name(device)}, {str(dtype).removeprefix('torch.')}"
             f"{', compiled' if args.compile else ''}")  # fmt: skip
    muon = f"Muon split {args.split}"
    a, b = interleave(whole(0), whole(1), args.rounds)
    report(f"training step with {muon} (reference: with AdamW; {shape})", a, b, args.steps * args.batch * args.seq,
           "tokens/s", comparison="optimizer", part="step", split=args.split)  # fmt: skip
    for side in (0, 1):  # gradients to step on, kept
        with autocast(device, dtype):
            runs[side](x, y)[1].backward()
    a, b = interleave(alone(0), alone(1), args.rounds)
    report(f"the optimizer's step alone, {muon} (reference: AdamW; {shape})", a, b, args.steps, "steps/s",
           comparison="optimizer", part="optimizer", split=args.split)  # fmt: skip
