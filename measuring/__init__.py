"""The measuring tools, one module a job; the user runs them as ``python bench.py``, ``python bench_reference.py``
and ``python gpu_story.py`` (the top level's thin entry points).

bench.py (``bench_command``: its flags and modes) times the attention grid (``cells``) with one clock (``timing``)
and says which figures to doubt (``noise``): an attention block or a GPT step (``step_times``, its table
``step_table`` and figure ``step_figures``), decoding (``decode_speed``), each block against the plainest code of
its layout and kernel (``plain_ratio``, the plain modules ``plain_attention``). bench_reference.py
(``reference_command``) sets headlab beside its references, the two timed in turn (``side_by_side``): the training
step (``step_references``), generation (``generation_reference``), whole processes (``process_references``), decode
steps (``decode_steps``). gpu_story.py (``story``) runs the GPU story's stages (``story_stages``).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: the scripts the references and the story run
