"""The registry of attention layouts and kernels: name -> the class that states its own facts.

A layout (``model.attention``, a class in ``model.attention``) and a kernel (``model.kernel``, a class in
``model.kernels``) register themselves here under their ``name``; the plan, plots, conversion, loading
and the scripts ask these classes (memory kept under autocast, the score matrix, dropout, CPU training,
plot styles, conversion) instead of matching names. A fourth layout or kernel is one class in its own
module, registered with ``@register(ATTENTION_LAYOUTS)`` or ``@register(KERNELS)``, plus its configs file.
"""

from __future__ import annotations

from common.choices import lookup as lookup  # re-exported: model.config and model.attention look names up here

# Filled by model.attention and model.kernels as they define their classes (importing ``model`` does both).
# Layouts are kept in definition order: state-dict keys are matched in this order (the wrapper's
# "heads.0.query" before "query" could claim it).
ATTENTION_LAYOUTS: dict[str, type] = {}
KERNELS: dict[str, type] = {}
POSITIONS: dict[str, type] = {}  # model.position: filled by model.positions
# The modifications of the attention (ALiBi's bias, QK-norm, softcap, sinks): filled by model.score_mods, in the
# order their parts of a run's label come and a kernel applies them.
SCORE_MODS: dict[str, type] = {}
# Which keys a query sees (causal, a window, ...): filled by model.masks, in the order a kernel ANDs them.
MASKS: dict[str, type] = {}


def register(registry: dict[str, type]):
    """Class decorator: enter the class in ``registry`` under its ``name``, after the class checks it can be told
    apart from those registered before it (``check_registration``, where it has one: a layout's weight names)."""

    def enter(cls: type) -> type:
        check = getattr(cls, "check_registration", None)
        if check is not None:
            check(registry)
        registry[cls.name] = cls
        return cls

    return enter


def layout(name: str) -> type:
    """The attention layout class registered as ``name`` (an unknown name lists the valid ones)."""
    return lookup(ATTENTION_LAYOUTS, "attention layout", name)


def kernel(name: str) -> type:
    """The kernel class registered as ``name`` (an unknown name lists the valid ones)."""
    return lookup(KERNELS, "attention kernel", name)


def position(name: str) -> type:
    """The position encoding registered as ``name`` (an unknown name lists the valid ones)."""
    return lookup(POSITIONS, "model.position", name)


def canonical_layout() -> str:
    """The layout every model's initial weights are drawn in (then converted): for a seed, every layout
    starts from the same weights. The one layout that says ``canonical = True`` itself (a subclass of it, a new
    layout built on the fused one, does not inherit the claim)."""
    (name,) = [name for name, cls in ATTENTION_LAYOUTS.items() if cls.__dict__.get("canonical", False)]
    return name


# The kernel= option vocabulary: a kernel's name, or <kernel>_<backend> for a kernel held to one of the
# implementations it takes (``sdpa_flash``: model.kernel=sdpa, model.sdpa_backend=flash).


def kernel_option(kernel_name: str, backend: str = "auto") -> str:
    """The kernel as the ``kernel=`` option spells it: the name, or ``<name>_<backend>``."""
    return kernel_name if backend == "auto" else f"{kernel_name}_{backend}"


def kernel_options() -> list[str]:
    """Every ``kernel=`` spelling: each kernel's name, then its held-to-one-implementation options."""
    names = sorted(KERNELS)
    return [*names, *(kernel_option(name, b) for name in names for b in KERNELS[name].backends)]


def split_kernel_option(option: str) -> tuple[str, str]:
    """A ``kernel=`` spelling -> (model.kernel, model.sdpa_backend): ``sdpa_flash`` -> (sdpa, flash); a name
    that is no held option is returned with ``auto`` (an unknown one is refused where it is looked up)."""
    for name, cls in KERNELS.items():
        for backend in cls.backends:
            if option == kernel_option(name, backend):
                return name, backend
    return option, "auto"
