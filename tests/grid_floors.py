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
        "cells": (73, 166), "kernel manual": (37, 74), "kernel sdpa": (36, 70), "kernel flex": (0, 22),
        "heads mha": (20, 53), "heads gqa": (19, 69), "heads mqa": (34, 44), "mask window": (40, 102),
        "mask chunked": (12, 14),
    },
    "layout separate_qkv": {
        "cells": (77, 176), "kernel manual": (41, 78), "kernel sdpa": (36, 73), "kernel flex": (0, 25),
        "heads mha": (22, 55), "heads gqa": (33, 78), "heads mqa": (22, 43), "mask window": (36, 105),
        "mask chunked": (12, 16),
    },
    "layout fused_qkv": {
        "cells": (77, 178), "kernel manual": (41, 77), "kernel sdpa": (36, 74), "kernel flex": (0, 27),
        "heads mha": (26, 59), "heads gqa": (25, 67), "heads mqa": (26, 52), "mask window": (41, 110),
        "mask chunked": (12, 16),
    },
    "layout mla": {
        "cells": (40, 71), "kernel manual": (21, 34), "kernel sdpa": (19, 32), "kernel flex": (0, 5),
        "heads mha": (40, 71), "mask window": (21, 45), "mask chunked": (4, 4),
    },
    "layout gated_deltanet": {"cells": (7, 7), "kernel sdpa": (7, 7), "heads mha": (7, 7)},
    "layout kda": {"cells": (7, 7), "kernel sdpa": (7, 7), "heads mha": (7, 7)},
    "kernel manual": {
        "cells": (140, 263), "layout wrapper": (37, 74), "layout separate_qkv": (41, 78), "layout fused_qkv": (41, 77),
        "layout mla": (21, 34), "heads mha": (57, 112), "heads gqa": (39, 85), "heads mqa": (44, 66),
        "mask window": (62, 166), "mask chunked": (20, 20),
    },
    "kernel sdpa": {
        "cells": (141, 263), "layout wrapper": (36, 70), "layout separate_qkv": (36, 73), "layout fused_qkv": (36, 74),
        "layout mla": (19, 32), "layout gated_deltanet": (7, 7), "layout kda": (7, 7), "heads mha": (65, 113),
        "heads gqa": (38, 98), "heads mqa": (38, 52), "mask window": (76, 155), "mask chunked": (20, 20),
    },
    "kernel flex": {
        "cells": (0, 79), "layout wrapper": (0, 22), "layout separate_qkv": (0, 25), "layout fused_qkv": (0, 27),
        "layout mla": (0, 5), "heads mha": (0, 27), "heads gqa": (0, 31), "heads mqa": (0, 21), "mask window": (0, 41),
        "mask chunked": (0, 10),
    },
    "position learned": {
        "cells": (206, 384), "layout wrapper": (54, 102), "layout separate_qkv": (58, 112),
        "layout fused_qkv": (58, 112), "layout mla": (28, 50), "layout gated_deltanet": (4, 4), "layout kda": (4, 4),
        "kernel manual": (104, 162), "kernel sdpa": (102, 161), "kernel flex": (0, 61), "heads mha": (93, 173),
        "heads gqa": (57, 111), "heads mqa": (56, 100), "mask window": (94, 234), "mask chunked": (40, 50),
    },
    "position rope": {
        "cells": (24, 78), "layout wrapper": (8, 23), "layout separate_qkv": (9, 25), "layout fused_qkv": (6, 28),
        "layout mla": (1, 2), "kernel manual": (17, 37), "kernel sdpa": (7, 31), "kernel flex": (0, 10),
        "heads mha": (7, 25), "heads gqa": (7, 36), "heads mqa": (10, 17), "mask window": (15, 47),
    },
    "position alibi": {
        "cells": (21, 61), "layout wrapper": (6, 18), "layout separate_qkv": (4, 18), "layout fused_qkv": (6, 16),
        "layout mla": (5, 9), "kernel manual": (9, 29), "kernel sdpa": (12, 29), "kernel flex": (0, 3),
        "heads mha": (6, 25), "heads gqa": (6, 26), "heads mqa": (9, 10), "mask window": (14, 36),
    },
    "position none": {
        "cells": (23, 57), "layout wrapper": (3, 14), "layout separate_qkv": (4, 13), "layout fused_qkv": (4, 14),
        "layout mla": (6, 10), "layout gated_deltanet": (3, 3), "layout kda": (3, 3), "kernel manual": (8, 23),
        "kernel sdpa": (15, 30), "kernel flex": (0, 4), "heads mha": (14, 24), "heads gqa": (4, 24),
        "heads mqa": (5, 9), "mask window": (11, 31),
    },
    "position path": {
        "cells": (7, 25), "layout wrapper": (2, 9), "layout separate_qkv": (2, 8), "layout fused_qkv": (3, 8),
        "kernel manual": (2, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 1), "heads mha": (2, 5),
        "heads gqa": (3, 17), "heads mqa": (2, 3), "mask window": (4, 14),
    },
    "modification alibi": {
        "cells": (21, 61), "layout wrapper": (6, 18), "layout separate_qkv": (4, 18), "layout fused_qkv": (6, 16),
        "layout mla": (5, 9), "kernel manual": (9, 29), "kernel sdpa": (12, 29), "kernel flex": (0, 3),
        "heads mha": (6, 25), "heads gqa": (6, 26), "heads mqa": (9, 10), "mask window": (14, 36),
    },
    "modification qk_norm": {
        "cells": (32, 86), "layout wrapper": (9, 25), "layout separate_qkv": (8, 25), "layout fused_qkv": (9, 24),
        "layout mla": (6, 12), "kernel manual": (19, 42), "kernel sdpa": (13, 36), "kernel flex": (0, 8),
        "heads mha": (9, 42), "heads gqa": (7, 23), "heads mqa": (16, 21), "mask window": (22, 54),
    },
    "modification softcap": {
        "cells": (12, 26), "layout wrapper": (4, 8), "layout separate_qkv": (3, 8), "layout fused_qkv": (3, 8),
        "layout mla": (2, 2), "kernel manual": (12, 23), "kernel flex": (0, 3), "heads mha": (5, 6),
        "heads gqa": (5, 15), "heads mqa": (2, 5), "mask window": (9, 17),
    },
    "modification sinks": {
        "cells": (22, 93), "layout wrapper": (6, 27), "layout separate_qkv": (6, 30), "layout fused_qkv": (6, 28),
        "layout mla": (4, 8), "kernel manual": (13, 47), "kernel sdpa": (9, 37), "kernel flex": (0, 9),
        "heads mha": (10, 25), "heads gqa": (3, 54), "heads mqa": (9, 14), "mask window": (14, 52),
    },
    "modification gate": {
        "cells": (16, 42), "layout wrapper": (5, 12), "layout separate_qkv": (5, 13), "layout fused_qkv": (4, 13),
        "layout mla": (2, 4), "kernel manual": (9, 20), "kernel sdpa": (7, 20), "kernel flex": (0, 2),
        "heads mha": (4, 19), "heads gqa": (4, 13), "heads mqa": (8, 10), "mask window": (9, 27),
    },
    "modification forget_gate": {
        "cells": (12, 30), "layout wrapper": (4, 9), "layout separate_qkv": (3, 8), "layout fused_qkv": (3, 9),
        "layout mla": (2, 4), "kernel manual": (5, 14), "kernel sdpa": (7, 14), "kernel flex": (0, 2),
        "heads mha": (5, 14), "heads gqa": (5, 8), "heads mqa": (2, 8), "mask window": (9, 20),
    },
    "modification path": {
        "cells": (7, 25), "layout wrapper": (2, 9), "layout separate_qkv": (2, 8), "layout fused_qkv": (3, 8),
        "kernel manual": (2, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 1), "heads mha": (2, 5),
        "heads gqa": (3, 17), "heads mqa": (2, 3), "mask window": (4, 14),
    },
    "mask causal": {
        "cells": (281, 605), "layout wrapper": (73, 166), "layout separate_qkv": (77, 176),
        "layout fused_qkv": (77, 178), "layout mla": (40, 71), "layout gated_deltanet": (7, 7), "layout kda": (7, 7),
        "kernel manual": (140, 263), "kernel sdpa": (141, 263), "kernel flex": (0, 79), "heads mha": (122, 252),
        "heads gqa": (77, 214), "heads mqa": (82, 139),
    },
    "mask window": {
        "cells": (138, 362), "layout wrapper": (40, 102), "layout separate_qkv": (36, 105),
        "layout fused_qkv": (41, 110), "layout mla": (21, 45), "kernel manual": (62, 166), "kernel sdpa": (76, 155),
        "kernel flex": (0, 41), "heads mha": (53, 143), "heads gqa": (40, 130), "heads mqa": (45, 89),
    },
    "mask chunked": {
        "cells": (40, 50), "layout wrapper": (12, 14), "layout separate_qkv": (12, 16), "layout fused_qkv": (12, 16),
        "layout mla": (4, 4), "kernel manual": (20, 20), "kernel sdpa": (20, 20), "kernel flex": (0, 10),
        "heads mha": (16, 20), "heads gqa": (12, 14), "heads mqa": (12, 16),
    },
    "option dropout": {"cells": (0, 0)},
    "option k_eq_v": {
        "cells": (8, 26), "layout wrapper": (3, 9), "layout separate_qkv": (3, 8), "layout fused_qkv": (2, 9),
        "kernel manual": (3, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 2), "heads mha": (2, 9),
        "heads gqa": (2, 10), "heads mqa": (4, 7), "mask window": (6, 17),
    },
    "option rope_theta": {
        "cells": (4, 6), "layout wrapper": (2, 2), "layout separate_qkv": (1, 2), "layout fused_qkv": (1, 2),
        "kernel manual": (4, 6), "heads mha": (1, 3), "heads gqa": (1, 1), "heads mqa": (2, 2), "mask window": (4, 4),
    },
    "option rope_fraction": {
        "cells": (8, 26), "layout wrapper": (3, 8), "layout separate_qkv": (3, 9), "layout fused_qkv": (2, 9),
        "kernel manual": (5, 12), "kernel sdpa": (3, 12), "kernel flex": (0, 2), "heads mha": (2, 10),
        "heads gqa": (2, 9), "heads mqa": (4, 7), "mask window": (4, 16),
    },
    "option rope_scaling": {"cells": (0, 0)},
    "option rope_factor": {"cells": (0, 0)},
    "option rope_original_length": {"cells": (0, 0)},
    "option query_temperature": {
        "cells": (6, 16), "layout wrapper": (1, 4), "layout separate_qkv": (1, 4), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "heads mha": (2, 9), "heads gqa": (1, 4),
        "heads mqa": (3, 3), "mask window": (5, 11),
    },
    "option differential": {
        "cells": (8, 18), "layout separate_qkv": (4, 9), "layout fused_qkv": (4, 9), "kernel manual": (4, 8),
        "kernel sdpa": (4, 8), "kernel flex": (0, 2), "heads mha": (7, 13), "heads gqa": (1, 5),
        "mask window": (5, 12),
    },
    "option lambda_init": {
        "cells": (4, 9), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 5), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 1), "heads mha": (3, 6), "heads gqa": (1, 3), "mask window": (2, 6),
    },
    "option kv_latent": {
        "cells": (2, 4), "layout mla": (2, 4), "kernel manual": (2, 2), "kernel sdpa": (0, 2), "heads mha": (2, 4),
        "mask window": (0, 2),
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
        "cells": (8, 16), "layout wrapper": (2, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "heads mha": (2, 9), "heads gqa": (2, 4),
        "heads mqa": (4, 3), "mask window": (5, 11),
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
    "option compress_ratio": {"cells": (0, 0)},
    "option compress_topk": {"cells": (0, 0)},
    "option compress_window": {"cells": (0, 0)},
    "encoding rope": {
        "cells": (6, 14), "layout wrapper": (2, 4), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 5),
        "kernel manual": (4, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 2), "heads mha": (2, 6),
        "heads gqa": (2, 4), "heads mqa": (2, 4), "mask window": (3, 8),
    },
    "encoding alibi": {
        "cells": (8, 16), "layout wrapper": (2, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "heads mha": (2, 9), "heads gqa": (2, 4),
        "heads mqa": (4, 3), "mask window": (5, 11),
    },
    "encoding none": {
        "cells": (12, 22), "layout wrapper": (2, 5), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 5),
        "layout mla": (2, 4), "layout gated_deltanet": (2, 2), "layout kda": (2, 2), "kernel manual": (4, 8),
        "kernel sdpa": (8, 12), "kernel flex": (0, 2), "heads mha": (8, 11), "heads gqa": (2, 5), "heads mqa": (2, 6),
        "mask window": (5, 11),
    },
    "encoding path": {
        "cells": (6, 12), "layout wrapper": (2, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 4),
        "kernel manual": (2, 6), "kernel sdpa": (4, 6), "heads mha": (2, 5), "heads gqa": (2, 4), "heads mqa": (2, 3),
        "mask window": (4, 8),
    },
    "encoding qk_norm": {
        "cells": (8, 18), "layout wrapper": (2, 5), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 2),
        "heads mha": (2, 10), "heads gqa": (2, 4), "heads mqa": (4, 4), "mask window": (5, 11),
    },
    "encoding softcap": {
        "cells": (8, 8), "layout wrapper": (2, 2), "layout separate_qkv": (2, 2), "layout fused_qkv": (2, 2),
        "layout mla": (2, 2), "kernel manual": (8, 8), "heads mha": (4, 3), "heads gqa": (4, 2), "heads mqa": (0, 3),
        "mask window": (5, 5),
    },
    "encoding sinks": {
        "cells": (8, 18), "layout wrapper": (2, 4), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 5),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 2),
        "heads mha": (6, 8), "heads gqa": (0, 5), "heads mqa": (2, 5), "mask window": (4, 11),
    },
    "encoding gate": {
        "cells": (8, 16), "layout wrapper": (2, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "heads mha": (2, 9), "heads gqa": (2, 4),
        "heads mqa": (4, 3), "mask window": (5, 11),
    },
    "encoding forget_gate": {
        "cells": (8, 18), "layout wrapper": (2, 5), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 5),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 2),
        "heads mha": (4, 9), "heads gqa": (4, 4), "heads mqa": (0, 5), "mask window": (5, 12),
    },
    "encoding rope500+qk_norm+softcap+sinks": {
        "cells": (4, 6), "layout wrapper": (2, 2), "layout separate_qkv": (1, 2), "layout fused_qkv": (1, 2),
        "kernel manual": (4, 6), "heads mha": (1, 3), "heads gqa": (1, 1), "heads mqa": (2, 2), "mask window": (4, 4),
    },
    "encoding alibi+qk_norm+sinks": {
        "cells": (6, 18), "layout wrapper": (1, 5), "layout separate_qkv": (1, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 2),
        "heads mha": (2, 10), "heads gqa": (1, 4), "heads mqa": (3, 4), "mask window": (4, 11),
    },
    "encoding rope_fraction0.5+headgate+sinks": {
        "cells": (4, 12), "layout wrapper": (1, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (1, 4),
        "kernel manual": (2, 6), "kernel sdpa": (2, 6), "heads mha": (1, 4), "heads gqa": (1, 5), "heads mqa": (2, 3),
        "mask window": (2, 8),
    },
    "encoding rope_fraction+gate+qk_norm": {
        "cells": (4, 14), "layout wrapper": (2, 4), "layout separate_qkv": (1, 5), "layout fused_qkv": (1, 5),
        "kernel manual": (3, 6), "kernel sdpa": (1, 6), "kernel flex": (0, 2), "heads mha": (1, 6),
        "heads gqa": (1, 4), "heads mqa": (2, 4), "mask window": (2, 8),
    },
    "encoding none+query_temperature+qk_norm": {
        "cells": (6, 16), "layout wrapper": (1, 4), "layout separate_qkv": (1, 4), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "heads mha": (2, 9), "heads gqa": (1, 4),
        "heads mqa": (3, 3), "mask window": (5, 11),
    },
    "encoding k_eq_v+rope+qk_norm": {
        "cells": (4, 14), "layout wrapper": (1, 5), "layout separate_qkv": (2, 4), "layout fused_qkv": (1, 5),
        "kernel manual": (2, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 2), "heads mha": (1, 4),
        "heads gqa": (1, 6), "heads mqa": (2, 4), "mask window": (2, 9),
    },
    "encoding k_eq_v+alibi+forget_gate": {
        "cells": (4, 12), "layout wrapper": (2, 4), "layout separate_qkv": (1, 4), "layout fused_qkv": (1, 4),
        "kernel manual": (1, 6), "kernel sdpa": (3, 6), "heads mha": (1, 5), "heads gqa": (1, 4), "heads mqa": (2, 3),
        "mask window": (4, 8),
    },
    "encoding differential": {
        "cells": (4, 9), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 4), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 1), "heads mha": (4, 7), "heads gqa": (0, 2), "mask window": (3, 6),
    },
    "encoding lambda_init": {
        "cells": (4, 9), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 5), "kernel manual": (2, 4),
        "kernel sdpa": (2, 4), "kernel flex": (0, 1), "heads mha": (3, 6), "heads gqa": (1, 3), "mask window": (2, 6),
    },
    "encoding kv_latent": {
        "cells": (2, 4), "layout mla": (2, 4), "kernel manual": (2, 2), "kernel sdpa": (0, 2), "heads mha": (2, 4),
        "mask window": (0, 2),
    },
    "encoding ssmax": {
        "cells": (8, 16), "layout wrapper": (2, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "heads mha": (2, 9), "heads gqa": (2, 4),
        "heads mqa": (4, 3), "mask window": (5, 11),
    },
    "encoding negative_eigenvalues": {
        "cells": (4, 4), "layout gated_deltanet": (2, 2), "layout kda": (2, 2), "kernel sdpa": (4, 4),
        "heads mha": (4, 4),
    },
}

if __name__ == "__main__":
    rewrite()
