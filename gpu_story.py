"""The GPU story in one command, on the GPU at hand, in at most 10 minutes (``python gpu_story.py --help``). The code
is measuring/'s: the stages (measuring/story_stages.py) and their run (measuring/story.py)."""

from __future__ import annotations

from common.startup import guard_start_up

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

from measuring.story import parse_args, story

if __name__ == "__main__":
    story(parse_args())  # exits 1 where nothing was measured
