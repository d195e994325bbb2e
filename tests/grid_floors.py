"""The floors of the property grids' cell counts: for each registered value (tests/grid_census.py), the fewest cells
that may exercise it, in all and with each layout, kernel, key/value heads ("heads mha|gqa|mqa") and mask it met, as
(default run, --deep run). A test of tests/test_attention_properties.py
(test_no_registered_value_loses_cells_in_the_default_or_the_deep_run) fails when a count falls below its floor, when
a registered value has no floor, and when a floor names a value no longer registered.

The table is written by the grids, never by hand: `python tests/grid_floors.py` rewrites it from the grids as they
are. Run it when a value's cells are added (to raise its floors: optional) or when losing some is meant (a value
removed, an entry changed on purpose): `git diff tests/grid_floors.py` then shows every count that moved, and the
commit says which value lost which cells and why."""

from __future__ import annotations

import sys
from pathlib import Path


def rewrite() -> None:
    """This file's FLOORS, from the grids' cells now."""
    here = Path(__file__).resolve()
    sys.path[:0] = [str(here.parent.parent), str(here.parent)]  # the repository's modules, and the tests' helpers
    import test_attention_properties as grids
    from grid_census import floors_source, registered_values

    text = here.read_text()
    start = text.index("\nFLOORS = {\n") + 1  # the table, at the start of a line
    end = text.index("\n}\n", start) + 3
    table = floors_source(grids.census(), registered_values(grids.ENCODINGS))
    here.write_text(text[:start] + table + text[end:])
    print(f"{here}: the floors of {table.count(': {')} values rewritten; `git diff {here.name}` shows what moved")


FLOORS = {
    "layout wrapper": {
        "cells": (67, 262), "kernel manual": (34, 89), "kernel sdpa": (33, 85), "kernel flex": (0, 88),
        "heads mha": (19, 75), "heads gqa": (18, 107), "heads mqa": (30, 80), "mask window": (36, 168),
        "mask chunked": (12, 27),
    },
    "layout separate_qkv": {
        "cells": (72, 273), "kernel manual": (40, 93), "kernel sdpa": (32, 88), "kernel flex": (0, 92),
        "heads mha": (20, 89), "heads gqa": (32, 105), "heads mqa": (20, 79), "mask window": (33, 174),
        "mask chunked": (12, 27),
    },
    "layout fused_qkv": {
        "cells": (74, 274), "kernel manual": (39, 92), "kernel sdpa": (33, 89), "kernel flex": (2, 93),
        "heads mha": (26, 85), "heads gqa": (24, 112), "heads mqa": (24, 77), "mask window": (36, 177),
        "mask chunked": (12, 27),
    },
    "layout mla": {
        "cells": (38, 115), "kernel manual": (19, 39), "kernel sdpa": (19, 37), "kernel flex": (0, 39),
        "heads mha": (38, 115), "mask window": (21, 75), "mask chunked": (4, 9),
    },
    "layout gated_deltanet": {"cells": (5, 6), "kernel sdpa": (5, 6), "heads mha": (5, 6)},
    "layout kda": {"cells": (5, 6), "kernel sdpa": (5, 6), "heads mha": (5, 6)},
    "kernel manual": {
        "cells": (132, 313), "layout wrapper": (34, 89), "layout separate_qkv": (40, 93), "layout fused_qkv": (39, 92),
        "layout mla": (19, 39), "heads mha": (50, 129), "heads gqa": (40, 112), "heads mqa": (42, 72),
        "mask window": (60, 199), "mask chunked": (20, 30),
    },
    "kernel sdpa": {
        "cells": (127, 311), "layout wrapper": (33, 85), "layout separate_qkv": (32, 88), "layout fused_qkv": (33, 89),
        "layout mla": (19, 37), "layout gated_deltanet": (5, 6), "layout kda": (5, 6), "heads mha": (61, 122),
        "heads gqa": (34, 110), "heads mqa": (32, 79), "mask window": (66, 189), "mask chunked": (20, 30),
    },
    "kernel flex": {
        "cells": (2, 312), "layout wrapper": (0, 88), "layout separate_qkv": (0, 92), "layout fused_qkv": (2, 93),
        "layout mla": (0, 39), "heads mha": (2, 125), "heads gqa": (0, 102), "heads mqa": (0, 85),
        "mask window": (0, 206), "mask chunked": (0, 30),
    },
    "position learned": {
        "cells": (194, 668), "layout wrapper": (51, 185), "layout separate_qkv": (56, 196),
        "layout fused_qkv": (57, 196), "layout mla": (26, 85), "layout gated_deltanet": (2, 3), "layout kda": (2, 3),
        "kernel manual": (99, 224), "kernel sdpa": (93, 221), "kernel flex": (2, 223), "heads mha": (86, 288),
        "heads gqa": (56, 196), "heads mqa": (52, 184), "mask window": (88, 432), "mask chunked": (40, 90),
    },
    "position rope": {
        "cells": (20, 88), "layout wrapper": (7, 28), "layout separate_qkv": (7, 28), "layout fused_qkv": (5, 30),
        "layout mla": (1, 2), "kernel manual": (15, 31), "kernel sdpa": (5, 25), "kernel flex": (0, 32),
        "heads mha": (6, 24), "heads gqa": (6, 42), "heads mqa": (8, 22), "mask window": (13, 54),
    },
    "position alibi": {
        "cells": (17, 69), "layout wrapper": (4, 18), "layout separate_qkv": (3, 19), "layout fused_qkv": (5, 18),
        "layout mla": (5, 14), "kernel manual": (8, 23), "kernel sdpa": (9, 23), "kernel flex": (0, 23),
        "heads mha": (5, 26), "heads gqa": (5, 31), "heads mqa": (7, 12), "mask window": (10, 42),
    },
    "position none": {
        "cells": (23, 75), "layout wrapper": (3, 19), "layout separate_qkv": (4, 18), "layout fused_qkv": (4, 18),
        "layout mla": (6, 14), "layout gated_deltanet": (3, 3), "layout kda": (3, 3), "kernel manual": (8, 23),
        "kernel sdpa": (15, 30), "kernel flex": (0, 22), "heads mha": (14, 32), "heads gqa": (4, 31),
        "heads mqa": (5, 12), "mask window": (11, 44),
    },
    "position path": {
        "cells": (7, 36), "layout wrapper": (2, 12), "layout separate_qkv": (2, 12), "layout fused_qkv": (3, 12),
        "kernel manual": (2, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 12), "heads mha": (2, 6),
        "heads gqa": (3, 24), "heads mqa": (2, 6), "mask window": (4, 22),
    },
    "modification alibi": {
        "cells": (17, 69), "layout wrapper": (4, 18), "layout separate_qkv": (3, 19), "layout fused_qkv": (5, 18),
        "layout mla": (5, 14), "kernel manual": (8, 23), "kernel sdpa": (9, 23), "kernel flex": (0, 23),
        "heads mha": (5, 26), "heads gqa": (5, 31), "heads mqa": (7, 12), "mask window": (10, 42),
    },
    "modification qk_norm": {
        "cells": (28, 102), "layout wrapper": (8, 28), "layout separate_qkv": (6, 28), "layout fused_qkv": (8, 28),
        "layout mla": (6, 18), "kernel manual": (17, 36), "kernel sdpa": (11, 30), "kernel flex": (0, 36),
        "heads mha": (8, 46), "heads gqa": (6, 28), "heads mqa": (14, 28), "mask window": (20, 67),
    },
    "modification softcap": {
        "cells": (12, 44), "layout wrapper": (4, 13), "layout separate_qkv": (3, 13), "layout fused_qkv": (3, 14),
        "layout mla": (2, 4), "kernel manual": (12, 23), "kernel flex": (0, 21), "heads mha": (5, 10),
        "heads gqa": (5, 24), "heads mqa": (2, 10), "mask window": (9, 28),
    },
    "modification sinks": {
        "cells": (22, 128), "layout wrapper": (6, 38), "layout separate_qkv": (6, 39), "layout fused_qkv": (6, 39),
        "layout mla": (4, 12), "kernel manual": (13, 47), "kernel sdpa": (9, 37), "kernel flex": (0, 44),
        "heads mha": (10, 34), "heads gqa": (3, 72), "heads mqa": (9, 22), "mask window": (14, 77),
    },
    "modification gate": {
        "cells": (16, 60), "layout wrapper": (5, 18), "layout separate_qkv": (5, 18), "layout fused_qkv": (4, 18),
        "layout mla": (2, 6), "kernel manual": (9, 20), "kernel sdpa": (7, 20), "kernel flex": (0, 20),
        "heads mha": (4, 24), "heads gqa": (4, 18), "heads mqa": (8, 18), "mask window": (9, 39),
    },
    "modification forget_gate": {
        "cells": (6, 24), "layout wrapper": (1, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (1, 6),
        "layout mla": (2, 6), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 8),
        "heads mha": (4, 12), "heads gqa": (2, 6), "heads mqa": (0, 6), "mask window": (4, 16),
    },
    "modification path": {
        "cells": (7, 36), "layout wrapper": (2, 12), "layout separate_qkv": (2, 12), "layout fused_qkv": (3, 12),
        "kernel manual": (2, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 12), "heads mha": (2, 6),
        "heads gqa": (3, 24), "heads mqa": (2, 6), "mask window": (4, 22),
    },
    "mask causal": {
        "cells": (261, 936), "layout wrapper": (67, 262), "layout separate_qkv": (72, 273),
        "layout fused_qkv": (74, 274), "layout mla": (38, 115), "layout gated_deltanet": (5, 6), "layout kda": (5, 6),
        "kernel manual": (132, 313), "kernel sdpa": (127, 311), "kernel flex": (2, 312), "heads mha": (113, 376),
        "heads gqa": (74, 324), "heads mqa": (74, 236),
    },
    "mask window": {
        "cells": (126, 594), "layout wrapper": (36, 168), "layout separate_qkv": (33, 174),
        "layout fused_qkv": (36, 177), "layout mla": (21, 75), "kernel manual": (60, 199), "kernel sdpa": (66, 189),
        "kernel flex": (0, 206), "heads mha": (50, 234), "heads gqa": (37, 206), "heads mqa": (39, 154),
    },
    "mask chunked": {
        "cells": (40, 90), "layout wrapper": (12, 27), "layout separate_qkv": (12, 27), "layout fused_qkv": (12, 27),
        "layout mla": (4, 9), "kernel manual": (20, 30), "kernel sdpa": (20, 30), "kernel flex": (0, 30),
        "heads mha": (16, 36), "heads gqa": (12, 27), "heads mqa": (12, 27),
    },
    "option dropout": {"cells": (0, 0)},
    "option rope_theta": {
        "cells": (4, 12), "layout wrapper": (2, 4), "layout separate_qkv": (1, 4), "layout fused_qkv": (1, 4),
        "kernel manual": (4, 6), "kernel flex": (0, 6), "heads mha": (1, 4), "heads gqa": (1, 4), "heads mqa": (2, 4),
        "mask window": (4, 8),
    },
    "option rope_fraction": {
        "cells": (8, 36), "layout wrapper": (3, 12), "layout separate_qkv": (3, 12), "layout fused_qkv": (2, 12),
        "kernel manual": (5, 12), "kernel sdpa": (3, 12), "kernel flex": (0, 12), "heads mha": (2, 12),
        "heads gqa": (2, 12), "heads mqa": (4, 12), "mask window": (4, 23),
    },
    "option rope_scaling": {"cells": (0, 0)},
    "option rope_factor": {"cells": (0, 0)},
    "option rope_original_length": {"cells": (0, 0)},
    "option query_temperature": {
        "cells": (6, 24), "layout wrapper": (1, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (1, 6), "heads mqa": (3, 6), "mask window": (5, 16),
    },
    "option differential": {
        "cells": (8, 24), "layout separate_qkv": (4, 12), "layout fused_qkv": (4, 12), "kernel manual": (4, 8),
        "kernel sdpa": (4, 8), "kernel flex": (0, 8), "heads mha": (4, 18), "heads gqa": (4, 6),
        "mask window": (4, 16),
    },
    "option lambda_init": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (2, 9), "heads gqa": (2, 3), "mask window": (2, 8),
    },
    "option kv_latent": {
        "cells": (2, 6), "layout mla": (2, 6), "kernel manual": (2, 2), "kernel sdpa": (0, 2), "kernel flex": (0, 2),
        "heads mha": (2, 6), "mask window": (1, 3),
    },
    "option rope_head_dim": {
        "cells": (1, 2), "layout mla": (1, 2), "kernel manual": (1, 1), "kernel flex": (0, 1), "heads mha": (1, 2),
        "mask window": (1, 1),
    },
    "option linear_chunk": {"cells": (0, 0)},
    "option document_masking": {"cells": (0, 0)},
    "option sparse_topk": {"cells": (0, 0)},
    "option indexer_heads": {"cells": (0, 0)},
    "option indexer_dim": {"cells": (0, 0)},
    "encoding rope": {
        "cells": (6, 18), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "kernel manual": (4, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 6), "heads mha": (2, 6),
        "heads gqa": (2, 6), "heads mqa": (2, 6), "mask window": (3, 11),
    },
    "encoding alibi": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (2, 6), "heads mqa": (4, 6), "mask window": (5, 16),
    },
    "encoding none": {
        "cells": (12, 28), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "layout gated_deltanet": (2, 2), "layout kda": (2, 2), "kernel manual": (4, 8),
        "kernel sdpa": (8, 12), "kernel flex": (0, 8), "heads mha": (8, 16), "heads gqa": (2, 6), "heads mqa": (2, 6),
        "mask window": (5, 17),
    },
    "encoding path": {
        "cells": (6, 18), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "kernel manual": (2, 6), "kernel sdpa": (4, 6), "kernel flex": (0, 6), "heads mha": (2, 6),
        "heads gqa": (2, 6), "heads mqa": (2, 6), "mask window": (4, 13),
    },
    "encoding qk_norm": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (2, 6), "heads mqa": (4, 6), "mask window": (5, 16),
    },
    "encoding softcap": {
        "cells": (8, 16), "layout wrapper": (2, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (8, 8), "kernel flex": (0, 8), "heads mha": (4, 6), "heads gqa": (4, 4),
        "heads mqa": (0, 6), "mask window": (5, 10),
    },
    "encoding sinks": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (6, 12), "heads gqa": (0, 6), "heads mqa": (2, 6), "mask window": (4, 16),
    },
    "encoding gate": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (2, 6), "heads mqa": (4, 6), "mask window": (5, 16),
    },
    "encoding forget_gate": {
        "cells": (6, 24), "layout wrapper": (1, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (1, 6),
        "layout mla": (2, 6), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 8),
        "heads mha": (4, 12), "heads gqa": (2, 6), "heads mqa": (0, 6), "mask window": (4, 16),
    },
    "encoding rope500+qk_norm+softcap+sinks": {
        "cells": (4, 12), "layout wrapper": (2, 4), "layout separate_qkv": (1, 4), "layout fused_qkv": (1, 4),
        "kernel manual": (4, 6), "kernel flex": (0, 6), "heads mha": (1, 4), "heads gqa": (1, 4), "heads mqa": (2, 4),
        "mask window": (4, 8),
    },
    "encoding alibi+qk_norm+sinks": {
        "cells": (6, 24), "layout wrapper": (1, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (1, 6), "heads mqa": (3, 6), "mask window": (4, 16),
    },
    "encoding rope_fraction0.5+headgate+sinks": {
        "cells": (4, 18), "layout wrapper": (1, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (1, 6),
        "kernel manual": (2, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 6), "heads mha": (1, 6),
        "heads gqa": (1, 6), "heads mqa": (2, 6), "mask window": (2, 12),
    },
    "encoding rope_fraction+gate+qk_norm": {
        "cells": (4, 18), "layout wrapper": (2, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (1, 6),
        "kernel manual": (3, 6), "kernel sdpa": (1, 6), "kernel flex": (0, 6), "heads mha": (1, 6),
        "heads gqa": (1, 6), "heads mqa": (2, 6), "mask window": (2, 11),
    },
    "encoding none+query_temperature+qk_norm": {
        "cells": (6, 24), "layout wrapper": (1, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (1, 6), "heads mqa": (3, 6), "mask window": (5, 16),
    },
    "encoding differential": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (2, 9), "heads gqa": (2, 3), "mask window": (2, 8),
    },
    "encoding lambda_init": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (2, 9), "heads gqa": (2, 3), "mask window": (2, 8),
    },
    "encoding kv_latent": {
        "cells": (2, 6), "layout mla": (2, 6), "kernel manual": (2, 2), "kernel sdpa": (0, 2), "kernel flex": (0, 2),
        "heads mha": (2, 6), "mask window": (1, 3),
    },
}

if __name__ == "__main__":
    rewrite()
