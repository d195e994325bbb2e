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
        "cells": (65, 250), "kernel manual": (36, 85), "kernel sdpa": (29, 81), "kernel flex": (0, 84),
        "heads mha": (26, 77), "heads gqa": (18, 95), "heads mqa": (21, 78), "mask window": (29, 158),
        "mask chunked": (12, 27),
    },
    "layout separate_qkv": {
        "cells": (70, 261), "kernel manual": (35, 89), "kernel sdpa": (35, 84), "kernel flex": (0, 88),
        "heads mha": (21, 86), "heads gqa": (23, 102), "heads mqa": (26, 73), "mask window": (34, 171),
        "mask chunked": (12, 27),
    },
    "layout fused_qkv": {
        "cells": (71, 262), "kernel manual": (36, 88), "kernel sdpa": (33, 85), "kernel flex": (2, 89),
        "heads mha": (26, 84), "heads gqa": (23, 101), "heads mqa": (22, 77), "mask window": (35, 172),
        "mask chunked": (12, 27),
    },
    "layout mla": {
        "cells": (38, 115), "kernel manual": (21, 39), "kernel sdpa": (17, 37), "kernel flex": (0, 39),
        "heads mha": (38, 115), "mask window": (21, 74), "mask chunked": (4, 9),
    },
    "layout gated_deltanet": {"cells": (5, 6), "kernel sdpa": (5, 6), "heads mha": (5, 6)},
    "layout kda": {"cells": (5, 6), "kernel sdpa": (5, 6), "heads mha": (5, 6)},
    "kernel manual": {
        "cells": (128, 301), "layout wrapper": (36, 85), "layout separate_qkv": (35, 89), "layout fused_qkv": (36, 88),
        "layout mla": (21, 39), "heads mha": (54, 122), "heads gqa": (33, 111), "heads mqa": (41, 68),
        "mask window": (54, 201), "mask chunked": (20, 30),
    },
    "kernel sdpa": {
        "cells": (124, 299), "layout wrapper": (29, 81), "layout separate_qkv": (35, 84), "layout fused_qkv": (33, 85),
        "layout mla": (17, 37), "layout gated_deltanet": (5, 6), "layout kda": (5, 6), "heads mha": (65, 119),
        "heads gqa": (31, 95), "heads mqa": (28, 85), "mask window": (65, 186), "mask chunked": (20, 30),
    },
    "kernel flex": {
        "cells": (2, 300), "layout wrapper": (0, 84), "layout separate_qkv": (0, 88), "layout fused_qkv": (2, 89),
        "layout mla": (0, 39), "heads mha": (2, 133), "heads gqa": (0, 92), "heads mqa": (0, 75),
        "mask window": (0, 188), "mask chunked": (0, 30),
    },
    "position learned": {
        "cells": (194, 668), "layout wrapper": (51, 185), "layout separate_qkv": (55, 196),
        "layout fused_qkv": (58, 196), "layout mla": (26, 85), "layout gated_deltanet": (2, 3), "layout kda": (2, 3),
        "kernel manual": (97, 224), "kernel sdpa": (95, 221), "kernel flex": (2, 223), "heads mha": (90, 292),
        "heads gqa": (51, 194), "heads mqa": (53, 182), "mask window": (89, 435), "mask chunked": (40, 90),
    },
    "position rope": {
        "cells": (20, 88), "layout wrapper": (5, 28), "layout separate_qkv": (8, 28), "layout fused_qkv": (6, 30),
        "layout mla": (1, 2), "kernel manual": (15, 31), "kernel sdpa": (5, 25), "kernel flex": (0, 32),
        "heads mha": (6, 24), "heads gqa": (6, 42), "heads mqa": (8, 22), "mask window": (11, 54),
    },
    "position alibi": {
        "cells": (17, 69), "layout wrapper": (5, 18), "layout separate_qkv": (3, 19), "layout fused_qkv": (4, 18),
        "layout mla": (5, 14), "kernel manual": (9, 23), "kernel sdpa": (8, 23), "kernel flex": (0, 23),
        "heads mha": (8, 26), "heads gqa": (4, 31), "heads mqa": (5, 12), "mask window": (9, 42),
    },
    "position none": {
        "cells": (23, 75), "layout wrapper": (4, 19), "layout separate_qkv": (4, 18), "layout fused_qkv": (3, 18),
        "layout mla": (6, 14), "layout gated_deltanet": (3, 3), "layout kda": (3, 3), "kernel manual": (7, 23),
        "kernel sdpa": (16, 30), "kernel flex": (0, 22), "heads mha": (17, 32), "heads gqa": (3, 31),
        "heads mqa": (3, 12), "mask window": (10, 44),
    },
    "modification alibi": {
        "cells": (17, 69), "layout wrapper": (5, 18), "layout separate_qkv": (3, 19), "layout fused_qkv": (4, 18),
        "layout mla": (5, 14), "kernel manual": (9, 23), "kernel sdpa": (8, 23), "kernel flex": (0, 23),
        "heads mha": (8, 26), "heads gqa": (4, 31), "heads mqa": (5, 12), "mask window": (9, 42),
    },
    "modification qk_norm": {
        "cells": (28, 102), "layout wrapper": (8, 28), "layout separate_qkv": (8, 28), "layout fused_qkv": (6, 28),
        "layout mla": (6, 18), "kernel manual": (16, 36), "kernel sdpa": (12, 30), "kernel flex": (0, 36),
        "heads mha": (18, 46), "heads gqa": (2, 28), "heads mqa": (8, 28), "mask window": (15, 68),
    },
    "modification softcap": {
        "cells": (12, 41), "layout wrapper": (3, 12), "layout separate_qkv": (4, 12), "layout fused_qkv": (3, 13),
        "layout mla": (2, 4), "kernel manual": (12, 20), "kernel flex": (0, 21), "heads mha": (3, 14),
        "heads gqa": (3, 19), "heads mqa": (6, 8), "mask window": (7, 26),
    },
    "modification sinks": {
        "cells": (22, 116), "layout wrapper": (6, 34), "layout separate_qkv": (6, 35), "layout fused_qkv": (6, 35),
        "layout mla": (4, 12), "kernel manual": (15, 41), "kernel sdpa": (7, 34), "kernel flex": (0, 41),
        "heads mha": (11, 34), "heads gqa": (6, 60), "heads mqa": (5, 22), "mask window": (12, 70),
    },
    "modification gate": {
        "cells": (16, 60), "layout wrapper": (4, 18), "layout separate_qkv": (5, 18), "layout fused_qkv": (5, 18),
        "layout mla": (2, 6), "kernel manual": (9, 20), "kernel sdpa": (7, 20), "kernel flex": (0, 20),
        "heads mha": (8, 24), "heads gqa": (2, 18), "heads mqa": (6, 18), "mask window": (8, 39),
    },
    "modification forget_gate": {
        "cells": (6, 24), "layout wrapper": (1, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (1, 6), "heads mqa": (3, 6), "mask window": (5, 16),
    },
    "mask causal": {
        "cells": (254, 900), "layout wrapper": (65, 250), "layout separate_qkv": (70, 261),
        "layout fused_qkv": (71, 262), "layout mla": (38, 115), "layout gated_deltanet": (5, 6), "layout kda": (5, 6),
        "kernel manual": (128, 301), "kernel sdpa": (124, 299), "kernel flex": (2, 300), "heads mha": (121, 374),
        "heads gqa": (64, 298), "heads mqa": (69, 228),
    },
    "mask window": {
        "cells": (119, 575), "layout wrapper": (29, 158), "layout separate_qkv": (34, 171),
        "layout fused_qkv": (35, 172), "layout mla": (21, 74), "kernel manual": (54, 201), "kernel sdpa": (65, 186),
        "kernel flex": (0, 188), "heads mha": (53, 235), "heads gqa": (31, 193), "heads mqa": (35, 147),
    },
    "mask chunked": {
        "cells": (40, 90), "layout wrapper": (12, 27), "layout separate_qkv": (12, 27), "layout fused_qkv": (12, 27),
        "layout mla": (4, 9), "kernel manual": (20, 30), "kernel sdpa": (20, 30), "kernel flex": (0, 30),
        "heads mha": (16, 36), "heads gqa": (12, 27), "heads mqa": (12, 27),
    },
    "option dropout": {"cells": (0, 0)},
    "option rope_theta": {
        "cells": (4, 12), "layout wrapper": (1, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (1, 4),
        "kernel manual": (4, 6), "kernel flex": (0, 6), "heads mha": (1, 4), "heads gqa": (1, 4), "heads mqa": (2, 4),
        "mask window": (2, 8),
    },
    "option rope_fraction": {
        "cells": (8, 36), "layout wrapper": (2, 12), "layout separate_qkv": (3, 12), "layout fused_qkv": (3, 12),
        "kernel manual": (5, 12), "kernel sdpa": (3, 12), "kernel flex": (0, 12), "heads mha": (2, 12),
        "heads gqa": (2, 12), "heads mqa": (4, 12), "mask window": (4, 23),
    },
    "option rope_scaling": {"cells": (0, 0)},
    "option rope_factor": {"cells": (0, 0)},
    "option rope_original_length": {"cells": (0, 0)},
    "option query_temperature": {
        "cells": (6, 24), "layout wrapper": (2, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (1, 6),
        "layout mla": (2, 6), "kernel manual": (2, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (5, 12), "heads gqa": (0, 6), "heads mqa": (1, 6), "mask window": (4, 16),
    },
    "option differential": {
        "cells": (8, 24), "layout separate_qkv": (4, 12), "layout fused_qkv": (4, 12), "kernel manual": (4, 8),
        "kernel sdpa": (4, 8), "kernel flex": (0, 8), "heads mha": (6, 18), "heads gqa": (2, 6),
        "mask window": (5, 16),
    },
    "option lambda_init": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (2, 9), "heads gqa": (2, 3), "mask window": (2, 8),
    },
    "option kv_latent": {
        "cells": (2, 6), "layout mla": (2, 6), "kernel manual": (0, 2), "kernel sdpa": (2, 2), "kernel flex": (0, 2),
        "heads mha": (2, 6), "mask window": (1, 5),
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
    "option moba_block": {"cells": (0, 0)},
    "option moba_topk": {"cells": (0, 0)},
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
    "encoding qk_norm": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (6, 12), "heads gqa": (0, 6), "heads mqa": (2, 6), "mask window": (4, 16),
    },
    "encoding softcap": {
        "cells": (8, 16), "layout wrapper": (2, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (8, 8), "kernel flex": (0, 8), "heads mha": (2, 10),
        "heads gqa": (2, 2), "heads mqa": (4, 4), "mask window": (5, 11),
    },
    "encoding sinks": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (4, 12), "heads gqa": (4, 6), "heads mqa": (0, 6), "mask window": (5, 16),
    },
    "encoding gate": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (6, 12), "heads gqa": (0, 6), "heads mqa": (2, 6), "mask window": (4, 16),
    },
    "encoding forget_gate": {
        "cells": (6, 24), "layout wrapper": (1, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (1, 6), "heads mqa": (3, 6), "mask window": (5, 16),
    },
    "encoding rope500+qk_norm+softcap+sinks": {
        "cells": (4, 12), "layout wrapper": (1, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (1, 4),
        "kernel manual": (4, 6), "kernel flex": (0, 6), "heads mha": (1, 4), "heads gqa": (1, 4), "heads mqa": (2, 4),
        "mask window": (2, 8),
    },
    "encoding alibi+qk_norm+sinks": {
        "cells": (6, 24), "layout wrapper": (2, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (1, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (2, 8), "kernel flex": (0, 8),
        "heads mha": (5, 12), "heads gqa": (0, 6), "heads mqa": (1, 6), "mask window": (3, 16),
    },
    "encoding rope_fraction0.5+headgate+sinks": {
        "cells": (4, 18), "layout wrapper": (1, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (2, 6),
        "kernel manual": (3, 6), "kernel sdpa": (1, 6), "kernel flex": (0, 6), "heads mha": (1, 6),
        "heads gqa": (1, 6), "heads mqa": (2, 6), "mask window": (2, 11),
    },
    "encoding rope_fraction+gate+qk_norm": {
        "cells": (4, 18), "layout wrapper": (1, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (1, 6),
        "kernel manual": (2, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 6), "heads mha": (1, 6),
        "heads gqa": (1, 6), "heads mqa": (2, 6), "mask window": (2, 12),
    },
    "encoding none+query_temperature+qk_norm": {
        "cells": (6, 24), "layout wrapper": (2, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (1, 6),
        "layout mla": (2, 6), "kernel manual": (2, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (5, 12), "heads gqa": (0, 6), "heads mqa": (1, 6), "mask window": (4, 16),
    },
    "encoding differential": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (4, 9), "heads gqa": (0, 3), "mask window": (3, 8),
    },
    "encoding lambda_init": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (2, 9), "heads gqa": (2, 3), "mask window": (2, 8),
    },
    "encoding kv_latent": {
        "cells": (2, 6), "layout mla": (2, 6), "kernel manual": (0, 2), "kernel sdpa": (2, 2), "kernel flex": (0, 2),
        "heads mha": (2, 6), "mask window": (1, 5),
    },
}

if __name__ == "__main__":
    rewrite()
