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
        "cells": (73, 280), "kernel manual": (37, 95), "kernel sdpa": (36, 91), "kernel flex": (0, 94),
        "heads mha": (20, 81), "heads gqa": (19, 113), "heads mqa": (34, 86), "mask window": (40, 180),
        "mask chunked": (12, 27),
    },
    "layout separate_qkv": {
        "cells": (77, 291), "kernel manual": (41, 99), "kernel sdpa": (36, 94), "kernel flex": (0, 98),
        "heads mha": (22, 94), "heads gqa": (33, 112), "heads mqa": (22, 85), "mask window": (36, 188),
        "mask chunked": (12, 27),
    },
    "layout fused_qkv": {
        "cells": (79, 292), "kernel manual": (41, 98), "kernel sdpa": (36, 95), "kernel flex": (2, 99),
        "heads mha": (28, 92), "heads gqa": (25, 117), "heads mqa": (26, 83), "mask window": (41, 189),
        "mask chunked": (12, 27),
    },
    "layout mla": {
        "cells": (40, 121), "kernel manual": (21, 41), "kernel sdpa": (19, 39), "kernel flex": (0, 41),
        "heads mha": (40, 121), "mask window": (21, 78), "mask chunked": (4, 9),
    },
    "layout gated_deltanet": {"cells": (7, 8), "kernel sdpa": (7, 8), "heads mha": (7, 8)},
    "layout kda": {"cells": (7, 8), "kernel sdpa": (7, 8), "heads mha": (7, 8)},
    "kernel manual": {
        "cells": (140, 333), "layout wrapper": (37, 95), "layout separate_qkv": (41, 99), "layout fused_qkv": (41, 98),
        "layout mla": (21, 41), "heads mha": (57, 140), "heads gqa": (39, 115), "heads mqa": (44, 78),
        "mask window": (62, 213), "mask chunked": (20, 30),
    },
    "kernel sdpa": {
        "cells": (141, 335), "layout wrapper": (36, 91), "layout separate_qkv": (36, 94), "layout fused_qkv": (36, 95),
        "layout mla": (19, 39), "layout gated_deltanet": (7, 8), "layout kda": (7, 8), "heads mha": (65, 131),
        "heads gqa": (38, 119), "heads mqa": (38, 85), "mask window": (76, 202), "mask chunked": (20, 30),
    },
    "kernel flex": {
        "cells": (2, 332), "layout wrapper": (0, 94), "layout separate_qkv": (0, 98), "layout fused_qkv": (2, 99),
        "layout mla": (0, 41), "heads mha": (2, 133), "heads gqa": (0, 108), "heads mqa": (0, 91),
        "mask window": (0, 220), "mask chunked": (0, 30),
    },
    "position learned": {
        "cells": (208, 696), "layout wrapper": (54, 191), "layout separate_qkv": (58, 202),
        "layout fused_qkv": (60, 202), "layout mla": (28, 91), "layout gated_deltanet": (4, 5), "layout kda": (4, 5),
        "kernel manual": (104, 232), "kernel sdpa": (102, 233), "kernel flex": (2, 231), "heads mha": (95, 304),
        "heads gqa": (57, 202), "heads mqa": (56, 190), "mask window": (94, 448), "mask chunked": (40, 90),
    },
    "position rope": {
        "cells": (24, 106), "layout wrapper": (8, 34), "layout separate_qkv": (9, 34), "layout fused_qkv": (6, 36),
        "layout mla": (1, 2), "kernel manual": (17, 37), "kernel sdpa": (7, 31), "kernel flex": (0, 38),
        "heads mha": (7, 30), "heads gqa": (7, 48), "heads mqa": (10, 28), "mask window": (15, 66),
    },
    "position alibi": {
        "cells": (21, 87), "layout wrapper": (6, 24), "layout separate_qkv": (4, 25), "layout fused_qkv": (6, 24),
        "layout mla": (5, 14), "kernel manual": (9, 29), "kernel sdpa": (12, 29), "kernel flex": (0, 29),
        "heads mha": (6, 32), "heads gqa": (6, 37), "heads mqa": (9, 18), "mask window": (14, 55),
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
        "cells": (21, 87), "layout wrapper": (6, 24), "layout separate_qkv": (4, 25), "layout fused_qkv": (6, 24),
        "layout mla": (5, 14), "kernel manual": (9, 29), "kernel sdpa": (12, 29), "kernel flex": (0, 29),
        "heads mha": (6, 32), "heads gqa": (6, 37), "heads mqa": (9, 18), "mask window": (14, 55),
    },
    "modification qk_norm": {
        "cells": (32, 120), "layout wrapper": (9, 34), "layout separate_qkv": (8, 34), "layout fused_qkv": (9, 34),
        "layout mla": (6, 18), "kernel manual": (19, 42), "kernel sdpa": (13, 36), "kernel flex": (0, 42),
        "heads mha": (9, 52), "heads gqa": (7, 34), "heads mqa": (16, 34), "mask window": (22, 79),
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
        "cells": (12, 42), "layout wrapper": (4, 12), "layout separate_qkv": (3, 12), "layout fused_qkv": (3, 12),
        "layout mla": (2, 6), "kernel manual": (5, 14), "kernel sdpa": (7, 14), "kernel flex": (0, 14),
        "heads mha": (5, 18), "heads gqa": (5, 12), "heads mqa": (2, 12), "mask window": (9, 29),
    },
    "modification path": {
        "cells": (7, 36), "layout wrapper": (2, 12), "layout separate_qkv": (2, 12), "layout fused_qkv": (3, 12),
        "kernel manual": (2, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 12), "heads mha": (2, 6),
        "heads gqa": (3, 24), "heads mqa": (2, 6), "mask window": (4, 22),
    },
    "mask causal": {
        "cells": (283, 1000), "layout wrapper": (73, 280), "layout separate_qkv": (77, 291),
        "layout fused_qkv": (79, 292), "layout mla": (40, 121), "layout gated_deltanet": (7, 8), "layout kda": (7, 8),
        "kernel manual": (140, 333), "kernel sdpa": (141, 335), "kernel flex": (2, 332), "heads mha": (124, 404),
        "heads gqa": (77, 342), "heads mqa": (82, 254),
    },
    "mask window": {
        "cells": (138, 635), "layout wrapper": (40, 180), "layout separate_qkv": (36, 188),
        "layout fused_qkv": (41, 189), "layout mla": (21, 78), "kernel manual": (62, 213), "kernel sdpa": (76, 202),
        "kernel flex": (0, 220), "heads mha": (53, 250), "heads gqa": (40, 217), "heads mqa": (45, 168),
    },
    "mask chunked": {
        "cells": (40, 90), "layout wrapper": (12, 27), "layout separate_qkv": (12, 27), "layout fused_qkv": (12, 27),
        "layout mla": (4, 9), "kernel manual": (20, 30), "kernel sdpa": (20, 30), "kernel flex": (0, 30),
        "heads mha": (16, 36), "heads gqa": (12, 27), "heads mqa": (12, 27),
    },
    "option dropout": {"cells": (0, 0)},
    "option k_eq_v": {
        "cells": (8, 36), "layout wrapper": (3, 12), "layout separate_qkv": (3, 12), "layout fused_qkv": (2, 12),
        "kernel manual": (3, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 12), "heads mha": (2, 12),
        "heads gqa": (2, 12), "heads mqa": (4, 12), "mask window": (6, 25),
    },
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
        "kernel sdpa": (4, 8), "kernel flex": (0, 8), "heads mha": (7, 18), "heads gqa": (1, 6),
        "mask window": (5, 16),
    },
    "option lambda_init": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (3, 9), "heads gqa": (1, 3), "mask window": (2, 8),
    },
    "option kv_latent": {
        "cells": (2, 6), "layout mla": (2, 6), "kernel manual": (2, 2), "kernel sdpa": (0, 2), "kernel flex": (0, 2),
        "heads mha": (2, 6), "mask window": (0, 3),
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
    "option ssmax": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (2, 6), "heads mqa": (4, 6), "mask window": (5, 16),
    },
    "option negative_eigenvalues": {
        "cells": (4, 4), "layout gated_deltanet": (2, 2), "layout kda": (2, 2), "kernel sdpa": (4, 4),
        "heads mha": (4, 4),
    },
    "option moba_block": {"cells": (0, 0)},
    "option moba_topk": {"cells": (0, 0)},
    "option nsa_block": {"cells": (0, 0)},
    "option nsa_topk": {"cells": (0, 0)},
    "option nsa_window": {"cells": (0, 0)},
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
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (4, 12), "heads gqa": (4, 6), "heads mqa": (0, 6), "mask window": (5, 16),
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
    "encoding k_eq_v+rope+qk_norm": {
        "cells": (4, 18), "layout wrapper": (1, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (1, 6),
        "kernel manual": (2, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 6), "heads mha": (1, 6),
        "heads gqa": (1, 6), "heads mqa": (2, 6), "mask window": (2, 12),
    },
    "encoding k_eq_v+alibi+forget_gate": {
        "cells": (4, 18), "layout wrapper": (2, 6), "layout separate_qkv": (1, 6), "layout fused_qkv": (1, 6),
        "kernel manual": (1, 6), "kernel sdpa": (3, 6), "kernel flex": (0, 6), "heads mha": (1, 6),
        "heads gqa": (1, 6), "heads mqa": (2, 6), "mask window": (4, 13),
    },
    "encoding differential": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (4, 9), "heads gqa": (0, 3), "mask window": (3, 8),
    },
    "encoding lambda_init": {
        "cells": (4, 12), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 4), "heads mha": (3, 9), "heads gqa": (1, 3), "mask window": (2, 8),
    },
    "encoding kv_latent": {
        "cells": (2, 6), "layout mla": (2, 6), "kernel manual": (2, 2), "kernel sdpa": (0, 2), "kernel flex": (0, 2),
        "heads mha": (2, 6), "mask window": (0, 3),
    },
    "encoding ssmax": {
        "cells": (8, 24), "layout wrapper": (2, 6), "layout separate_qkv": (2, 6), "layout fused_qkv": (2, 6),
        "layout mla": (2, 6), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 8),
        "heads mha": (2, 12), "heads gqa": (2, 6), "heads mqa": (4, 6), "mask window": (5, 16),
    },
    "encoding negative_eigenvalues": {
        "cells": (4, 4), "layout gated_deltanet": (2, 2), "layout kda": (2, 2), "kernel sdpa": (4, 4),
        "heads mha": (4, 4),
    },
}

if __name__ == "__main__":
    rewrite()
