"""The scripts' check of their command line against their own config, before Hydra sees it: a key or a group
option that does not exist is one line naming the nearest valid ones, instead of Hydra's page (or, with ``+``,
a value that nothing reads)."""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shlex
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def check_overrides(config_name: str, command: str, argv: list[str] | None = None) -> None:
    """Exit with one line, before any work, for an override Hydra would refuse with a page or accept wrongly.

    A key or a config group option that does not exist names the nearest valid ones (``trainer.max_step`` ->
    ``trainer.max_steps``); ``+key=value`` that the schema does not know is refused the same way (Hydra would
    add it, and nothing would read it); a value of the wrong type, a list of values without ``-m`` and text
    Hydra's grammar cannot read each get one line with the fix. Hydra's own ``hydra.*`` / ``hydra/...``
    overrides are left to Hydra, and so is anything this check cannot compose (Hydra then reports it).
    ``config_name`` is the script's primary config; its schema must be registered already.
    """
    from hydra._internal.utils import get_args_parser

    args = sys.argv[1:] if argv is None else argv
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = get_args_parser().parse_args(args)
    except SystemExit:  # not even Hydra's flags parse: Hydra says so itself
        return
    if parsed.config_path or parsed.config_dir or parsed.config_name or parsed.experimental_rerun:
        return  # another config than the script's own
    if parsed.shell_completion or parsed.info:
        return
    parsed_args = [_parse_override(arg, config_name, command) for arg in parsed.overrides]
    own = [o for o, _ in parsed_args if not o.is_hydra_override() and o.package is None]
    if not parsed.multirun:
        for o in own:
            if o.is_sweep_override():
                _refuse_sweep_without_multirun(o)
    _check_against_config(config_name, command, own)
    for _, unreadable in parsed_args:  # the key is right (checked first: promt=f(x) is a typo of the key)
        if unreadable:
            sys.exit(unreadable)


def set_by(message: str, overrides: list[str], config_name: str) -> str:
    """``message``, an error that begins with an option the command did not type (``trainer.device=cuda but no
    CUDA GPU is visible``), saying which option it typed set it: ``trainer.device=cuda (set by trainer=gpu) but
    ...``. Each group it chose (``trainer=gpu``, ``experiment=...``) is left out of the config in turn: the one
    whose absence changes the value set it. Unchanged where the option was typed, or came from the defaults.
    Called inside the script's Hydra run (where ``compose`` reads its config), on the way to an error only."""
    from hydra import compose

    typed = re.match(r"([A-Za-z_][\w.]*)=(\S+?)(?=[\s,;:)]|$)", message)
    if typed is None:
        return message
    key = typed.group(1)
    keys = [o.partition("=")[0].lstrip("+~") for o in overrides]
    if key in keys:
        return message
    try:
        value = OmegaConf.select(compose(config_name, overrides=overrides), key)
        for override, typed_key in zip(overrides, keys):
            if "." in typed_key or "=" not in override:  # a value, not a group's choice: it sets only itself
                continue
            without = [o for o in overrides if o != override]
            if OmegaConf.select(compose(config_name, overrides=without), key) != value:
                return message.replace(typed.group(0), f"{typed.group(0)} (set by {override})", 1)
    except Exception:  # noqa: BLE001  (the config cannot be composed again here: the error as it was, never another)
        return message
    return message


def _parse_override(arg: str, config_name: str, command: str):
    """The override, and for a value Hydra's grammar cannot read, the error to give once its key is checked
    (the override is then ``~key``: the key alone, no value)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    try:
        return parser.parse_override(arg), None
    except HydraException as err:
        key, sep, value = arg.partition("=")
        if not sep:
            sys.exit(_not_key_value(arg, config_name, command))
        reason = str(err).strip().splitlines()[0]
        unreadable = (f"error: {arg}: Hydra cannot read this value ({reason}); quote it for Hydra inside the "
                      f"shell's quotes: {key}=\"'{value}'\"")  # fmt: skip
        try:
            key_alone = parser.parse_override(f"~{key.lstrip('+~')}")
        except HydraException:
            sys.exit(f"error: {arg}: {key!r} cannot be an option's name (--help lists the options)")
        key_alone.input_line = arg
        return key_alone, unreadable


def _not_key_value(arg: str, config_name: str, command: str) -> str:
    """The error for an argument without ``=``. A path given alone (``sample.py runs/x``) is the model to read,
    for the scripts that read one (``source=``); ``runs/x=...`` would be no help."""
    if not _looks_like_a_path(arg):
        return f"error: {arg!r} is not an option: give key=value (e.g. {arg}=...)"
    if _has_option(config_name, "source"):
        return f"error: {arg!r} is not an option: give key=value; did you mean {shlex.quote(f'source={arg}')}?"
    return f"error: {arg!r} is not an option: give key=value ({command} --help lists every option)"


def _looks_like_a_path(arg: str) -> bool:
    return os.path.exists(arg) or "/" in arg or os.sep in arg or arg.startswith(("~", ".")) or arg.endswith(".pt")


def _has_option(config_name: str, key: str) -> bool:
    """Whether the script's config has ``key`` at its top (False where it cannot be composed: Hydra says why)."""
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            return key in compose(config_name).keys()  # `key in cfg` is False for a required (???) value
    except (OmegaConfBaseException, ValueError, OSError, ImportError):
        return False


def _refuse_sweep_without_multirun(o) -> None:
    sys.exit(f"error: {o.input_line} is several values: add -m to run one job per value (one value with a comma "
             f"is quoted for Hydra: {o.key_or_group}=\"'{o.input_line.partition('=')[2]}'\")")


def _check_against_config(config_name: str, command: str, own: list) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.types import OverrideType

    try:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose(config_name, return_hydra_config=True)
            choices = cfg.hydra.runtime.choices
            groups = {g: GlobalHydra.instance().config_loader().get_group_options(g)
                      for g in choices if not g.startswith("hydra/")}  # fmt: skip
            chosen = [o for o in own if o.key_or_group in groups]
            for o in chosen:
                _check_group_option(o, groups[o.key_or_group], choices[o.key_or_group])
            picked = [f"{o.key_or_group}={_first(o)}" for o in chosen if o.type != OverrideType.DEL and _first(o)]
            if picked:  # the keys of the options chosen (an experiment may set more than one group)
                cfg = compose(config_name, overrides=picked, return_hydra_config=True)
    except (OmegaConfBaseException, ValueError, OSError, ImportError):  # Hydra itself will say what is wrong
        return
    options = sorted(groups) + [key for key in _all_keys(cfg) if key not in groups and key.split(".")[0] != "hydra"]
    for o in own:
        if o.key_or_group not in groups:
            _check_key(o, cfg, options, command)


def _values(o) -> list:
    """The values an override sets: one, or each of a sweep's (``a,b`` / ``choice(a,b)`` / ``range(3)``)."""
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    value = o.value()
    if isinstance(value, ChoiceSweep):
        return list(value.list)
    if isinstance(value, RangeSweep):
        return list(o.sweep_iterator())[:1000]
    return [] if o.is_sweep_override() else [value]  # glob(), interval(): not checked here


def _first(o):
    values = _values(o)
    return values[0] if values and isinstance(values[0], str) else None


def _check_group_option(o, options: list[str], default) -> None:
    from hydra.core.override_parser.types import OverrideType

    group = o.key_or_group
    if o.type == OverrideType.ADD:
        sys.exit(f"error: {o.input_line}: {group} is chosen already (default {default}); "
                 f"drop the +: {o.input_line.lstrip('+')}")  # fmt: skip
    if o.type == OverrideType.DEL:
        return
    for value in _values(o):
        if str(value) not in options:  # null too: Hydra cannot unset a group from the command line
            typed = "null" if value is None else value
            near = difflib.get_close_matches(str(value), options, n=3, cutoff=0.5)
            mean = f"; did you mean {' or '.join(f'{group}={n}' for n in near)}?" if near else ""
            sys.exit(f"error: {group}={typed} is not an option of {group}{mean} ({group}: {', '.join(options)})")


def _all_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every key of the composed config, nodes and leaves, dotted (``trainer``, ``trainer.max_steps``)."""
    keys = []
    for key in cfg.keys():
        full = f"{prefix}{key}"
        keys.append(full)
        node = cfg._get_node(key)
        if isinstance(node, DictConfig):
            keys += _all_keys(node, f"{full}.")
    return keys


def _has_key(cfg: DictConfig, dotted: str) -> bool:
    """Whether Hydra would find ``dotted`` (a struct config refuses any other key; a plain dict takes any)."""
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, DictConfig):
            return True  # inside a list or a value: OmegaConf's own check says what is wrong
        if part not in node.keys():
            return not OmegaConf.is_struct(node)
        node = node._get_node(part)
    return True


def _adds_to_a_mapping(cfg: DictConfig, dotted: str) -> bool:
    """Whether ``dotted`` is a new key inside an option that is a mapping of any keys (a ``dict`` field, such as
    ``model.layer_kinds``): Hydra adds it with ``+`` (``+model.layer_kinds.L.window=128``)."""
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, DictConfig):
            return False
        if part not in node.keys():
            return node._metadata.object_type is dict
        node = node._get_node(part)
    return False


def _nearest(typed: str, options: list[str]) -> list[str]:
    """The options closest to ``typed``: among its siblings where its parent exists (``trainer.max_step`` ->
    ``trainer.max_steps``), else by the whole dotted key, else by its last part (``max_steps`` alone)."""
    parent, _, leaf = typed.rpartition(".")
    siblings = [o for o in options if o.rpartition(".")[0] == parent]
    if parent in options:  # the option list of that node says the rest
        near = difflib.get_close_matches(leaf, [o.rpartition(".")[2] for o in siblings], n=3, cutoff=0.7)
        return [f"{parent}.{n}" for n in near]
    near = difflib.get_close_matches(typed, options, n=3, cutoff=0.7)
    if near:
        return near
    leaves = difflib.get_close_matches(leaf, [o.rpartition(".")[2] for o in options], n=3, cutoff=0.75)
    return [o for o in options if o.rpartition(".")[2] in leaves][:3]


def _check_key(o, cfg: DictConfig, options: list[str], command: str) -> None:
    from hydra.core.override_parser.types import OverrideType

    key = o.key_or_group
    if _adds_to_a_mapping(cfg, key):
        if o.type == OverrideType.DEL:
            sys.exit(f"error: {o.input_line}: {key} is not set, so there is nothing to remove; drop {o.input_line}")
        if o.type not in (OverrideType.ADD, OverrideType.FORCE_ADD):
            sys.exit(f"error: {o.input_line}: {key} is a new key of a mapping; add it with a +: +{o.input_line}")
        _apply(o, cfg)
        return
    known = _has_key(cfg, key)
    if known and o.type == OverrideType.ADD:
        sys.exit(f"error: {o.input_line}: {key} is an option already; set it without the +: {o.input_line[1:]}")
    if not known:
        near = _nearest(key, options)
        parent = key.rpartition(".")[0]
        if near:
            fix = f"did you mean {' or '.join(near)}?"
        else:
            siblings = [k.rpartition(".")[2] for k in options if k.rpartition(".")[0] == parent]
            fix = f"{parent + ' has' if parent and siblings else 'the options are'}: {', '.join(siblings or options)}"
        adding = o.type in (OverrideType.ADD, OverrideType.FORCE_ADD)
        plus = " (+ cannot add an option: nothing would read it)" if adding else ""
        sys.exit(f"error: {o.input_line}: no such option{plus}; {fix} ({command} --help lists every option)")
    if o.type in (OverrideType.CHANGE, OverrideType.FORCE_ADD):
        for value in _values(o):  # applied in turn, as Hydra does
            try:
                OmegaConf.update(cfg, key, value, merge=True)
            except (OmegaConfBaseException, ValueError) as err:
                reason = str(err).strip().splitlines()[0]
                sys.exit(f"error: {key}={value}: {reason} ({command} --help lists every option and its default)")
    elif o.type == OverrideType.DEL:
        _apply(o, cfg)


def _apply(o, cfg: DictConfig) -> None:
    """What a mapping's new key or a removal does to ``cfg``, so that the overrides after it are checked against
    the config it leaves: Hydra applies them in turn, so a key one adds (``+model.layer_kinds.L.window=64``)
    another may change (``model.layer_kinds.L.window=32``) or remove (``~model.layer_kinds.L.window``)."""
    from hydra.core.override_parser.types import OverrideType

    parent, _, leaf = o.key_or_group.rpartition(".")
    try:
        if o.type == OverrideType.DEL:
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if isinstance(node, DictConfig) and leaf in node:
                with open_dict(node):
                    del node[leaf]
        elif _values(o):
            OmegaConf.update(cfg, o.key_or_group, _values(o)[0], merge=True, force_add=True)
    except (OmegaConfBaseException, ValueError):  # Hydra will say what is wrong with it
        pass
