"""How a run's label spells each option (``option(label=...)``): the part an option set away from its default adds
to ``<attention>-<kernel>`` (``-window64``, ``-keqv``, ``-ssmax0.43``), and how the label's grammar names it.

A plain part is its word and the option's value: a true flag is the word alone (``keqv``), a number follows the word
(``window64``, ``ssmax0.43``), and a sweep that varies the option spells its off value ``no<word>`` (``nowindow``).
A part that reads more than its own option (the key/value heads or the latent, rotary's base and scaling, sparse
attention's indexer) spells itself (``spell``); the fields it reads beside its own are a sweep's axes too
(``fields``). ``model.config.attention_label`` puts the parts together in the order run names have always had
(``LABEL_ORDER``), a part declared since then after them, in declaration order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from model import registry
from model.attention.blocks import MOBA_TOPK
from model.attention.differential import LAMBDA_INIT
from model.attention.modifications import finite_number
from model.attention.nsa import NSA_TOPK, NSA_WINDOW
from model.attention.sparse import INDEXER_DIM, INDEXER_HEADS


def number(value) -> str:
    """A value as a label spells it: an integer as it is (64), a float in its shortest form (0.43); a bad value (a
    layer kind's, unchecked yet) as given."""
    return f"{value:g}" if isinstance(value, float) and finite_number(value) else str(value)


@dataclass(frozen=True)
class LabelPart:
    """One option's part of a run label: ``word`` and ``title`` (the grammar's: ``-window<positions>``) for a plain
    part; ``spell(model, show)`` for one that reads more (None: no part), with its ``grammar`` (pattern, title) pairs
    and the other ``fields`` it reads; ``shows_off``: a sweep varying the option spells its off value ``no<word>``."""

    word: str
    title: str
    spell: Callable[[Mapping, tuple], str | None] | None = None
    grammar: tuple[tuple[str, str], ...] | Callable[[], tuple[tuple[str, str], ...]] = ()
    fields: tuple[str, ...] = ()
    shows_off: bool = True

    def spelled(self, name: str, model: Mapping, show) -> str | None:
        """This part of the label of ``model`` (a GPTConfig's fields, as run.json holds them; a field it lacks
        counts as its default), or None; ``show``: the axes spelled even at their default (a sweep's)."""
        if self.spell is not None:
            return self.spell(model, show)
        value = model.get(name)
        if not value:
            return f"no{self.word}" if self.shows_off and name in show else None
        return self.word if value is True else f"{self.word}{number(value)}"

    def patterns(self) -> tuple[tuple[str, str], ...]:
        """(pattern, title) of each part this spells: plot legends name the parts a label has."""
        if self.grammar:  # a callable: read as asked (position encodings registered since)
            return self.grammar() if callable(self.grammar) else self.grammar
        return ((rf"{'(no)?' if self.shows_off else ''}{re.escape(self.word)}[\d.e+-]*", self.title),)


def kv_heads(model: Mapping, show) -> str | None:
    """``latent<k>`` for keys and values kept as a latent (no key/value heads to count), ``kv<n>`` for fewer
    key/value heads than query heads (or a sweep's axis)."""
    latent = model.get("kv_latent")
    if latent is not None:
        return f"latent{latent}"
    kv = model.get("n_kv_head") or model.get("n_head")
    return f"kv{kv}" if kv != model.get("n_head") or "n_kv_head" in show else None


def position(model: Mapping, show) -> str | None:
    """``rope`` (``rope<theta>`` where theta is not 10000 or is swept; then ``ropefrac<share>``, ``<scaling><factor>``,
    ``ropeorig<length>``), or the encoding's own label: ``alibi``, ``nopos``, ``path``."""
    name = model.get("position", "learned")
    if name == "rope":
        theta = model.get("rope_theta", 10000.0)
        if not finite_number(theta):  # a bad value (a layer kind's, unchecked yet), spelled as given
            spelled = str(theta)
        else:
            spelled = f"{int(theta)}" if float(theta).is_integer() else f"{theta:g}"  # 500000, not 5e+05
        parts = [f"rope{spelled}" if theta != 10000 or "rope_theta" in show else "rope"]
        fraction = model.get("rope_fraction", 1.0)
        if fraction != 1:  # -ropefrac0.25: the share of each head's dims that turns
            parts.append(f"ropefrac{fraction:g}" if finite_number(fraction) else f"ropefrac{fraction}")
        if model.get("rope_scaling"):  # -yarn4: the scaling and its factor
            parts.append(f"{model['rope_scaling']}{model.get('rope_factor', 1.0):g}")
        if model.get("rope_original_length") is not None:  # -ropeorig64: the length YaRN counts turns over
            parts.append(f"ropeorig{model['rope_original_length']}")
        return "-".join(parts)
    if name != "learned" or "position" in show:
        # an unknown name is spelled as given: the label also names runs before the config is checked
        return getattr(registry.POSITIONS.get(name), "label", None) or name
    return None


def position_grammar() -> tuple[tuple[str, str], ...]:
    return (
        ("|".join(f"{re.escape(cls.label or name)}[\\d.e+]*" for name, cls in registry.POSITIONS.items()),
         "-<position>"),
        (r"ropefrac[\d.e+]+", "-ropefrac<share of dims turned>"), ("(pi|ntk|yarn)[\\d.e+]+", "-<rope scaling><factor>"),
        (r"ropeorig\d+", "-ropeorig<trained length>"),
    )  # fmt: skip


def differential(model: Mapping, show) -> str | None:
    """``diff`` (``diff<lambda_init>`` away from the paper's 0.8)."""
    if not (model.get("differential") or "differential" in show):
        return None
    lam = model.get("lambda_init", LAMBDA_INIT)
    return ("diff" if lam == LAMBDA_INIT else f"diff{lam}") if model.get("differential") else "nodiff"


def sparse(model: Mapping, show) -> str | None:
    """DeepSeek's sparse attention: ``top<k>`` (``top64idx2x16`` for another indexer shape); ``dense`` swept off."""
    if not (model.get("sparse_topk") or "sparse_topk" in show):
        return None
    shape = (model.get("indexer_heads", INDEXER_HEADS), model.get("indexer_dim", INDEXER_DIM))
    indexer = "" if shape == (INDEXER_HEADS, INDEXER_DIM) else f"idx{shape[0]}x{shape[1]}"
    return f"top{model['sparse_topk']}{indexer}" if model.get("sparse_topk") else "dense"


def moba(model: Mapping, show) -> str | None:
    """MoBA: ``moba<block>k<blocks each query attends>``."""
    if not (model.get("moba_block") or "moba_block" in show):
        return None
    return f"moba{model['moba_block']}k{model.get('moba_topk', MOBA_TOPK)}" if model.get("moba_block") else "nomoba"


def nsa(model: Mapping, show) -> str | None:
    """NSA: ``nsa<block>k<blocks selected>w<window>``."""
    if not (model.get("nsa_block") or "nsa_block" in show):
        return None
    if not model.get("nsa_block"):
        return "nonsa"
    return f"nsa{model['nsa_block']}k{model.get('nsa_topk', NSA_TOPK)}w{model.get('nsa_window', NSA_WINDOW)}"


KV_HEADS = LabelPart("kv", "", kv_heads, ((r"kv\d+", "-kv<key/value heads>"), (r"latent\d+", "-latent<dims>")),
                     fields=("kv_latent",))  # fmt: skip
POSITION = LabelPart("", "", position, position_grammar, fields=("rope_theta", "rope_fraction", "rope_scaling",
                                                                 "rope_factor", "rope_original_length"))  # fmt: skip
DIFFERENTIAL = LabelPart("diff", "", differential, ((r"(no)?diff[\d.e+-]*", "-diff[<lambda_init>]"),),
                         fields=("lambda_init",))  # fmt: skip
SPARSE = LabelPart("top", "", sparse, ((r"top\d+(idx\d+x\d+)?|dense",
                                        "-top<keys per query>[idx<indexer heads>x<width>] (sparse attention)"),),
                   fields=("indexer_heads", "indexer_dim"))  # fmt: skip
MOBA = LabelPart("moba", "", moba, ((r"moba\d+k\d+|nomoba", "-moba<positions per block>k<blocks per query> (MoBA)"),),
                 fields=("moba_topk",))  # fmt: skip
NSA = LabelPart("nsa", "", nsa, ((r"nsa\d+k\d+w\d+|nonsa",
                                  "-nsa<positions per block>k<blocks selected>w<window> (NSA)"),),
                fields=("nsa_topk", "nsa_window"))  # fmt: skip
