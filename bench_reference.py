"""headlab against its references, side by side in one process, interleaved (``python bench_reference.py --help``).
The code is measuring/'s, from its command line (measuring/reference_command.py) down, one module a comparison."""

from __future__ import annotations

from common.startup import guard_start_up

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

from measuring.reference_command import main

if __name__ == "__main__":
    main()
