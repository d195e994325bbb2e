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
        "cells": (73, 181), "kernel manual": (37, 74), "kernel sdpa": (36, 70), "kernel flex": (0, 37),
        "heads mha": (20, 57), "heads gqa": (19, 75), "heads mqa": (34, 49), "mask window": (40, 111),
        "mask chunked": (12, 16),
    },
    "layout separate_qkv": {
        "cells": (77, 192), "kernel manual": (41, 78), "kernel sdpa": (36, 73), "kernel flex": (0, 41),
        "heads mha": (22, 62), "heads gqa": (33, 84), "heads mqa": (22, 46), "mask window": (36, 119),
        "mask chunked": (12, 17),
    },
    "layout fused_qkv": {
        "cells": (77, 193), "kernel manual": (41, 77), "kernel sdpa": (36, 74), "kernel flex": (0, 42),
        "heads mha": (26, 65), "heads gqa": (25, 73), "heads mqa": (26, 55), "mask window": (41, 121),
        "mask chunked": (12, 17),
    },
    "layout mla": {
        "cells": (40, 75), "kernel manual": (21, 34), "kernel sdpa": (19, 32), "kernel flex": (0, 9),
        "heads mha": (40, 75), "mask window": (21, 47), "mask chunked": (4, 5),
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
        "cells": (0, 129), "layout wrapper": (0, 37), "layout separate_qkv": (0, 41), "layout fused_qkv": (0, 42),
        "layout mla": (0, 9), "heads mha": (0, 48), "heads gqa": (0, 49), "heads mqa": (0, 32), "mask window": (0, 77),
        "mask chunked": (0, 15),
    },
    "position learned": {
        "cells": (206, 422), "layout wrapper": (54, 114), "layout separate_qkv": (58, 124),
        "layout fused_qkv": (58, 122), "layout mla": (28, 54), "layout gated_deltanet": (4, 4), "layout kda": (4, 4),
        "kernel manual": (104, 162), "kernel sdpa": (102, 161), "kernel flex": (0, 99), "heads mha": (93, 189),
        "heads gqa": (57, 123), "heads mqa": (56, 110), "mask window": (94, 262), "mask chunked": (40, 55),
    },
    "position rope": {
        "cells": (24, 81), "layout wrapper": (8, 25), "layout separate_qkv": (9, 25), "layout fused_qkv": (6, 29),
        "layout mla": (1, 2), "kernel manual": (17, 37), "kernel sdpa": (7, 31), "kernel flex": (0, 13),
        "heads mha": (7, 26), "heads gqa": (7, 37), "heads mqa": (10, 18), "mask window": (15, 49),
    },
    "position alibi": {
        "cells": (21, 65), "layout wrapper": (6, 18), "layout separate_qkv": (4, 20), "layout fused_qkv": (6, 18),
        "layout mla": (5, 9), "kernel manual": (9, 29), "kernel sdpa": (12, 29), "kernel flex": (0, 7),
        "heads mha": (6, 27), "heads gqa": (6, 28), "heads mqa": (9, 10), "mask window": (14, 39),
    },
    "position none": {
        "cells": (23, 59), "layout wrapper": (3, 15), "layout separate_qkv": (4, 14), "layout fused_qkv": (4, 14),
        "layout mla": (6, 10), "layout gated_deltanet": (3, 3), "layout kda": (3, 3), "kernel manual": (8, 23),
        "kernel sdpa": (15, 30), "kernel flex": (0, 6), "heads mha": (14, 25), "heads gqa": (4, 25),
        "heads mqa": (5, 9), "mask window": (11, 32),
    },
    "position path": {
        "cells": (7, 28), "layout wrapper": (2, 9), "layout separate_qkv": (2, 9), "layout fused_qkv": (3, 10),
        "kernel manual": (2, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 4), "heads mha": (2, 6),
        "heads gqa": (3, 19), "heads mqa": (2, 3), "mask window": (4, 16),
    },
    "modification alibi": {
        "cells": (21, 65), "layout wrapper": (6, 18), "layout separate_qkv": (4, 20), "layout fused_qkv": (6, 18),
        "layout mla": (5, 9), "kernel manual": (9, 29), "kernel sdpa": (12, 29), "kernel flex": (0, 7),
        "heads mha": (6, 27), "heads gqa": (6, 28), "heads mqa": (9, 10), "mask window": (14, 39),
    },
    "modification qk_norm": {
        "cells": (32, 88), "layout wrapper": (9, 25), "layout separate_qkv": (8, 26), "layout fused_qkv": (9, 25),
        "layout mla": (6, 12), "kernel manual": (19, 42), "kernel sdpa": (13, 36), "kernel flex": (0, 10),
        "heads mha": (9, 44), "heads gqa": (7, 23), "heads mqa": (16, 21), "mask window": (22, 56),
    },
    "modification softcap": {
        "cells": (12, 29), "layout wrapper": (4, 9), "layout separate_qkv": (3, 8), "layout fused_qkv": (3, 10),
        "layout mla": (2, 2), "kernel manual": (12, 23), "kernel flex": (0, 6), "heads mha": (5, 7),
        "heads gqa": (5, 17), "heads mqa": (2, 5), "mask window": (9, 19),
    },
    "modification sinks": {
        "cells": (22, 98), "layout wrapper": (6, 29), "layout separate_qkv": (6, 31), "layout fused_qkv": (6, 30),
        "layout mla": (4, 8), "kernel manual": (13, 47), "kernel sdpa": (9, 37), "kernel flex": (0, 14),
        "heads mha": (10, 26), "heads gqa": (3, 57), "heads mqa": (9, 15), "mask window": (14, 55),
    },
    "modification gate": {
        "cells": (16, 44), "layout wrapper": (5, 13), "layout separate_qkv": (5, 14), "layout fused_qkv": (4, 13),
        "layout mla": (2, 4), "kernel manual": (9, 20), "kernel sdpa": (7, 20), "kernel flex": (0, 4),
        "heads mha": (4, 20), "heads gqa": (4, 13), "heads mqa": (8, 11), "mask window": (9, 29),
    },
    "modification forget_gate": {
        "cells": (12, 31), "layout wrapper": (4, 9), "layout separate_qkv": (3, 8), "layout fused_qkv": (3, 10),
        "layout mla": (2, 4), "kernel manual": (5, 14), "kernel sdpa": (7, 14), "kernel flex": (0, 3),
        "heads mha": (5, 15), "heads gqa": (5, 8), "heads mqa": (2, 8), "mask window": (9, 21),
    },
    "modification path": {
        "cells": (7, 28), "layout wrapper": (2, 9), "layout separate_qkv": (2, 9), "layout fused_qkv": (3, 10),
        "kernel manual": (2, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 4), "heads mha": (2, 6),
        "heads gqa": (3, 19), "heads mqa": (2, 3), "mask window": (4, 16),
    },
    "mask causal": {
        "cells": (281, 655), "layout wrapper": (73, 181), "layout separate_qkv": (77, 192),
        "layout fused_qkv": (77, 193), "layout mla": (40, 75), "layout gated_deltanet": (7, 7), "layout kda": (7, 7),
        "kernel manual": (140, 263), "kernel sdpa": (141, 263), "kernel flex": (0, 129), "heads mha": (122, 273),
        "heads gqa": (77, 232), "heads mqa": (82, 150),
    },
    "mask window": {
        "cells": (138, 398), "layout wrapper": (40, 111), "layout separate_qkv": (36, 119),
        "layout fused_qkv": (41, 121), "layout mla": (21, 47), "kernel manual": (62, 166), "kernel sdpa": (76, 155),
        "kernel flex": (0, 77), "heads mha": (53, 160), "heads gqa": (40, 140), "heads mqa": (45, 98),
    },
    "mask chunked": {
        "cells": (40, 55), "layout wrapper": (12, 16), "layout separate_qkv": (12, 17), "layout fused_qkv": (12, 17),
        "layout mla": (4, 5), "kernel manual": (20, 20), "kernel sdpa": (20, 20), "kernel flex": (0, 15),
        "heads mha": (16, 22), "heads gqa": (12, 16), "heads mqa": (12, 17),
    },
    "option dropout": {"cells": (0, 0)},
    "option k_eq_v": {
        "cells": (8, 27), "layout wrapper": (3, 9), "layout separate_qkv": (3, 8), "layout fused_qkv": (2, 10),
        "kernel manual": (3, 12), "kernel sdpa": (5, 12), "kernel flex": (0, 3), "heads mha": (2, 10),
        "heads gqa": (2, 10), "heads mqa": (4, 7), "mask window": (6, 18),
    },
    "option rope_theta": {
        "cells": (4, 7), "layout wrapper": (2, 2), "layout separate_qkv": (1, 2), "layout fused_qkv": (1, 3),
        "kernel manual": (4, 6), "kernel flex": (0, 1), "heads mha": (1, 4), "heads gqa": (1, 1), "heads mqa": (2, 2),
        "mask window": (4, 5),
    },
    "option rope_fraction": {
        "cells": (8, 27), "layout wrapper": (3, 9), "layout separate_qkv": (3, 9), "layout fused_qkv": (2, 9),
        "kernel manual": (5, 12), "kernel sdpa": (3, 12), "kernel flex": (0, 3), "heads mha": (2, 10),
        "heads gqa": (2, 9), "heads mqa": (4, 8), "mask window": (4, 17),
    },
    "option rope_scaling": {"cells": (0, 0)},
    "option rope_factor": {"cells": (0, 0)},
    "option rope_original_length": {"cells": (0, 0)},
    "option query_temperature": {
        "cells": (6, 17), "layout wrapper": (1, 4), "layout separate_qkv": (1, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 1),
        "heads mha": (2, 10), "heads gqa": (1, 4), "heads mqa": (3, 3), "mask window": (5, 12),
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
        "cells": (8, 17), "layout wrapper": (2, 4), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 1),
        "heads mha": (2, 10), "heads gqa": (2, 4), "heads mqa": (4, 3), "mask window": (5, 12),
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
        "cells": (6, 14), "layout wrapper": (2, 4), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 5),
        "kernel manual": (4, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 2), "heads mha": (2, 6),
        "heads gqa": (2, 4), "heads mqa": (2, 4), "mask window": (3, 8),
    },
    "encoding alibi": {
        "cells": (8, 17), "layout wrapper": (2, 4), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 1),
        "heads mha": (2, 10), "heads gqa": (2, 4), "heads mqa": (4, 3), "mask window": (5, 12),
    },
    "encoding none": {
        "cells": (12, 22), "layout wrapper": (2, 5), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 5),
        "layout mla": (2, 4), "layout gated_deltanet": (2, 2), "layout kda": (2, 2), "kernel manual": (4, 8),
        "kernel sdpa": (8, 12), "kernel flex": (0, 2), "heads mha": (8, 11), "heads gqa": (2, 5), "heads mqa": (2, 6),
        "mask window": (5, 11),
    },
    "encoding path": {
        "cells": (6, 13), "layout wrapper": (2, 4), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 5),
        "kernel manual": (2, 6), "kernel sdpa": (4, 6), "kernel flex": (0, 1), "heads mha": (2, 6),
        "heads gqa": (2, 4), "heads mqa": (2, 3), "mask window": (4, 9),
    },
    "encoding qk_norm": {
        "cells": (8, 18), "layout wrapper": (2, 5), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 2),
        "heads mha": (2, 10), "heads gqa": (2, 4), "heads mqa": (4, 4), "mask window": (5, 11),
    },
    "encoding softcap": {
        "cells": (8, 9), "layout wrapper": (2, 3), "layout separate_qkv": (2, 2), "layout fused_qkv": (2, 2),
        "layout mla": (2, 2), "kernel manual": (8, 8), "kernel flex": (0, 1), "heads mha": (4, 3), "heads gqa": (4, 3),
        "heads mqa": (0, 3), "mask window": (5, 6),
    },
    "encoding sinks": {
        "cells": (8, 18), "layout wrapper": (2, 4), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 5),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 2),
        "heads mha": (6, 8), "heads gqa": (0, 5), "heads mqa": (2, 5), "mask window": (4, 11),
    },
    "encoding gate": {
        "cells": (8, 17), "layout wrapper": (2, 4), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 1),
        "heads mha": (2, 10), "heads gqa": (2, 4), "heads mqa": (4, 3), "mask window": (5, 12),
    },
    "encoding forget_gate": {
        "cells": (8, 18), "layout wrapper": (2, 5), "layout separate_qkv": (2, 4), "layout fused_qkv": (2, 5),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 2),
        "heads mha": (4, 9), "heads gqa": (4, 4), "heads mqa": (0, 5), "mask window": (5, 12),
    },
    "encoding rope500+qk_norm+softcap+sinks": {
        "cells": (4, 7), "layout wrapper": (2, 2), "layout separate_qkv": (1, 2), "layout fused_qkv": (1, 3),
        "kernel manual": (4, 6), "kernel flex": (0, 1), "heads mha": (1, 4), "heads gqa": (1, 1), "heads mqa": (2, 2),
        "mask window": (4, 5),
    },
    "encoding alibi+qk_norm+sinks": {
        "cells": (6, 18), "layout wrapper": (1, 5), "layout separate_qkv": (1, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 2),
        "heads mha": (2, 10), "heads gqa": (1, 4), "heads mqa": (3, 4), "mask window": (4, 11),
    },
    "encoding rope_fraction0.5+headgate+sinks": {
        "cells": (4, 13), "layout wrapper": (1, 5), "layout separate_qkv": (2, 4), "layout fused_qkv": (1, 4),
        "kernel manual": (2, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 1), "heads mha": (1, 4),
        "heads gqa": (1, 5), "heads mqa": (2, 4), "mask window": (2, 9),
    },
    "encoding rope_fraction+gate+qk_norm": {
        "cells": (4, 14), "layout wrapper": (2, 4), "layout separate_qkv": (1, 5), "layout fused_qkv": (1, 5),
        "kernel manual": (3, 6), "kernel sdpa": (1, 6), "kernel flex": (0, 2), "heads mha": (1, 6),
        "heads gqa": (1, 4), "heads mqa": (2, 4), "mask window": (2, 8),
    },
    "encoding none+query_temperature+qk_norm": {
        "cells": (6, 17), "layout wrapper": (1, 4), "layout separate_qkv": (1, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (3, 8), "kernel sdpa": (3, 8), "kernel flex": (0, 1),
        "heads mha": (2, 10), "heads gqa": (1, 4), "heads mqa": (3, 3), "mask window": (5, 12),
    },
    "encoding k_eq_v+rope+qk_norm": {
        "cells": (4, 14), "layout wrapper": (1, 5), "layout separate_qkv": (2, 4), "layout fused_qkv": (1, 5),
        "kernel manual": (2, 6), "kernel sdpa": (2, 6), "kernel flex": (0, 2), "heads mha": (1, 4),
        "heads gqa": (1, 6), "heads mqa": (2, 4), "mask window": (2, 9),
    },
    "encoding k_eq_v+alibi+forget_gate": {
        "cells": (4, 13), "layout wrapper": (2, 4), "layout separate_qkv": (1, 4), "layout fused_qkv": (1, 5),
        "kernel manual": (1, 6), "kernel sdpa": (3, 6), "kernel flex": (0, 1), "heads mha": (1, 6),
        "heads gqa": (1, 4), "heads mqa": (2, 3), "mask window": (4, 9),
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
        "cells": (8, 17), "layout wrapper": (2, 4), "layout separate_qkv": (2, 5), "layout fused_qkv": (2, 4),
        "layout mla": (2, 4), "kernel manual": (4, 8), "kernel sdpa": (4, 8), "kernel flex": (0, 1),
        "heads mha": (2, 10), "heads gqa": (2, 4), "heads mqa": (4, 3), "mask window": (5, 12),
    },
    "encoding negative_eigenvalues": {
        "cells": (4, 4), "layout gated_deltanet": (2, 2), "layout kda": (2, 2), "kernel sdpa": (4, 4),
        "heads mha": (4, 4),
    },
}

if __name__ == "__main__":
    rewrite()
