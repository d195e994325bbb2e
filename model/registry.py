"""The registries of the model's axes: name -> the class that states its own facts.

A layer (``model.attention``: a layout of the attention pipeline in ``model.attention``, or a mixer of its own form in
``model.mixers``), a kernel (``model.kernel``), a position encoding, a modification of the attention and a mask
register themselves here under their ``name``; the plan, plots, conversion, loading and the scripts ask these classes
instead of matching names. A new value is one class in a module of ``model.attention`` or ``model.mixers`` (every
module of both is imported when ``model`` is: ``discover``), registered with ``@register(...)``, plus its configs
file.
"""

from __future__ import annotations

import importlib
import pkgutil

from common.choices import lookup as lookup  # re-exported: model.config and model.attention look names up here

# Filled as their modules define their classes (importing ``model`` imports every one: ``discover``).
# The token mixers, each a value of model.attention: the layouts of the attention pipeline (model.attention: wrapper,
# separate_qkv, fused_qkv, mla) and the mixers of their own form (model.mixers: gated_deltanet, kda). A state dict's
# keys are matched to the mixer whose weight-name pattern matches earliest in the key (``model.checkpoints.convert``),
# so the order of registration says nothing.
MIXERS: dict[str, type] = {}
KERNELS: dict[str, type] = {}
POSITIONS: dict[str, type] = {}  # model.position: filled by model.attention.positions
# The modifications of softmax attention, each at its stage of the pipeline (``Modification.stage``): QK-norm of the
# heads' encodings; ALiBi's bias, softcap, sinks and the forget gate on the scores (the kernel's); the output gate.
# Filled by model.attention.modifications, in the order their parts of a run's label come and a kernel applies them.
MODIFICATIONS: dict[str, type] = {}
# Which keys a query sees (causal, a window, ...): filled by model.attention.masks, in the order a kernel ANDs them.
MASKS: dict[str, type] = {}
# The key selections beyond the masks (DeepSeek's sparse attention, MoBA's blocks): filled by their own modules
# (``model.attention.selection.KeySelection``); the pipeline's key selection stage asks them.
SELECTIONS: dict[str, type] = {}


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


# The packages whose every module may register a value of an axis: a new module there is found, not listed.
PACKAGES = ("model.attention", "model.mixers")


def discover() -> None:
    """Import every module of ``PACKAGES`` (by name), so that each registers what it defines."""
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        for module in sorted(m.name for m in pkgutil.iter_modules(path)):
            importlib.import_module(f"{package}.{module}")


def weight_name_start(cls: type, key: str) -> int | None:
    """Where layer ``cls``'s q/k/v weight-name pattern (``QKV_KEY``) matches in state-dict ``key``, at a module
    boundary, or None: the layer matched earliest in a key holds it (``model.checkpoints.convert``)."""
    match = cls.QKV_KEY.search(key)
    return match.start() if match and (match.start() == 0 or key[match.start() - 1] == ".") else None


def mixer(name: str) -> type:
    """The mixer class registered as ``name`` (a value of model.attention; an unknown name lists the valid ones)."""
    return lookup(MIXERS, "attention layout", name)


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
    (name,) = [name for name, cls in MIXERS.items() if cls.__dict__.get("canonical", False)]
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
