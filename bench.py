"""Benchmark the attention layouts x kernels: the attention block alone, a whole GPT training step, decoding, or each
block against its plainest code (``python bench.py --help``). The code is measuring/'s, from its command line
(measuring/bench_command.py) down, one module a mode."""

from __future__ import annotations

from common.startup import guard_start_up

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

from measuring.bench_command import main

if __name__ == "__main__":
    main()
