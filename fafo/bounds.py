"""Declared bounds of the settings of every config group (methods, compressions, tasks, sampling, ``bench``):
integer ranges, number ranges and choices.

A bound sits next to its field (kvpress-style hyperparameter dataclasses)::

    n: int = at_least(1, 40)                 # streams: 0 cannot run
    stagger: int = at_least(0, 1)            # 0 is meaningful: every stream at P + 1
    m: int | None = at_least(1, None)        # null allowed (the annotation admits None)
    pooling: str = one_of(("max", "avg"), "max")
    max_spread: float = above(1.0, 1.5)      # a number > 1

and one checker, :func:`check_bounds`, refuses a value outside it (and anything but true or false in a ``bool``
field) with the line every setting gives (``method.n=0 must be an integer >= 1``, ``method.pooling='min' must be
one of max, avg``). It runs on the config node before a dataclass is built (:func:`check_node`, which also
refuses unknown keys and text where a number or a flag belongs) and again from the dataclasses' own
``__post_init__`` / ``Task.samples`` for objects built in Python. Cross-field rules (``min_ngram <= max_ngram``,
a budget that is a multiple of the chunk size) stay in the classes' ``__post_init__``.

A subclass that redeclares a field only to change its default keeps the bound declared higher up (the nearest
declaration with a bound in the MRO wins).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fafo.errors import ConfigError


def at_least(low: int, default: int | None, *, high: int | None = None, why: str = "", **kwargs) -> Any:
    """A dataclass field holding an integer ``>= low`` (and ``<= high``); an ``int | None`` annotation allows null.

    ``why`` is added to the error line (e.g. why N=2 is refused); extra ``kwargs`` go to ``dataclasses.field``.
    """
    metadata = {"ge": low, "le": high, "why": why, **kwargs.pop("metadata", {})}
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def one_of(choices: tuple, default: Any, *, why: str = "", **kwargs) -> Any:
    """A dataclass field whose value is one of ``choices`` (``None`` among them when null is allowed).

    ``why`` is added to the error line (what each choice means); extra ``kwargs`` go to ``dataclasses.field``.
    """
    assert default in choices, f"default {default!r} is not one of {choices}"
    metadata = {"choices": tuple(choices), "why": why, **kwargs.pop("metadata", {})}
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def above(low: float, default: float | None, *, inclusive: bool = False, why: str = "", **kwargs) -> Any:
    """A dataclass field holding a number ``> low`` (``>= low`` when ``inclusive``); ``float | None`` allows null."""
    metadata = {"number": low, "inclusive": inclusive, "why": why, **kwargs.pop("metadata", {})}
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def bound_of(cls: type, name: str) -> dict | None:
    """The bound declared for field ``name`` of dataclass ``cls`` (searched up the MRO), or None."""
    for klass in getattr(cls, "__mro__", ()):
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        if f is not None and {"ge", "choices", "number"} & set(f.metadata):
            return f.metadata
    return None


def bounded_fields(cls: type) -> dict[str, dict]:
    """{field name: bound} of every bounded init field of a dataclass."""
    if not dataclasses.is_dataclass(cls):
        return {}
    out = {}
    for f in dataclasses.fields(cls):
        bound = bound_of(cls, f.name) if f.init else None
        if bound is not None:
            out[f.name] = bound
    return out


def _nullable(cls: type, name: str) -> bool:
    """Whether the field's annotation (on ``cls`` itself: subclasses may differ) admits null."""
    f = getattr(cls, "__dataclass_fields__", {}).get(name)
    return f is not None and ("None" in str(f.type) or "Optional" in str(f.type) or f.default is None)


def check_bound(cls: type, name: str, value: Any, setting: str) -> None:
    """Refuse ``value`` for field ``name`` of ``cls`` when it breaks the declared bound (one ConfigError line)."""
    bound = bound_of(cls, name)
    why = f" ({bound['why']})" if bound is not None and bound.get("why") else ""
    if bound is not None and "choices" in bound:
        if not any(value == c and type(value) is type(c) for c in bound["choices"]):  # True is not 1
            names = ", ".join("null" if c is None else str(c).lower() if isinstance(c, bool) else str(c)
                              for c in bound["choices"])
            raise ConfigError(f"{setting}={value!r} must be one of {names}{why}")
        return
    if bound is None or (value is None and _nullable(cls, name)):
        return
    null = "null or " if _nullable(cls, name) else ""
    if "number" in bound:
        low, inclusive = bound["number"], bound["inclusive"]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                value >= low if inclusive else value > low):
            return
        raise ConfigError(f"{setting}={value!r} must be {null}a number {'>=' if inclusive else '>'} {low:g}{why}")
    low, high = bound["ge"], bound.get("le")
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if is_int and value >= low and (high is None or value <= high):
        return
    upper = f" and <= {high}" if high is not None else ""
    raise ConfigError(f"{setting}={value!r} must be {null}an integer >= {low}{upper}{why}")


def check_bounds(obj: Any, prefix: str) -> None:
    """Check every bounded field of the dataclass instance ``obj``, and that every ``bool`` field holds a bool;
    errors name ``<prefix>.<field>``."""
    cls = type(obj)
    for name in bounded_fields(cls):
        check_bound(cls, name, getattr(obj, name), f"{prefix}.{name}")
    for f in dataclasses.fields(cls):
        if f.init and f.type in ("bool", bool) and not isinstance(getattr(obj, f.name), bool):
            raise ConfigError(f"{prefix}.{f.name}={getattr(obj, f.name)!r} must be true or false")


def check_node(node: Mapping, setting: str, cls: type | None = None) -> None:
    """A config node against the dataclass it builds (``cls``, else its ``_target_`` when that is a dataclass):
    unknown keys, text where a number or a flag belongs (``sampling.temperature=abc``) and values outside their
    declared bounds (``method.n=0``), each one ConfigError line naming the setting. Nested targets are checked too."""
    if cls is None:
        from hydra.utils import get_object

        try:
            cls = get_object(str(node["_target_"]))
        except Exception:  # noqa: BLE001 - instantiate reports an unknown target itself
            return
    if not dataclasses.is_dataclass(cls):
        return
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in node:
        if key == "_target_":
            continue
        if key not in fields:
            known = f"its settings are {', '.join(fields)}" if fields else "it has no settings"
            raise ConfigError(f"{setting}.{key} is not a setting of {cls.__name__}; {known}")
        value = node[key]
        if isinstance(value, Mapping) and "_target_" in value:
            check_node(value, f"{setting}.{key}")
            continue
        default = fields[key].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{setting}.{key}={value!r} must be true or false")
        elif isinstance(default, (int, float)) and isinstance(value, str):
            raise ConfigError(f"{setting}.{key}={value!r} must be a number (default {default})")
        check_bound(cls, key, value, f"{setting}.{key}")


def plain(value: Any) -> Any:
    """A config value as plain Python containers: an OmegaConf node converted (interpolations resolved), mappings
    and lists converted item by item, anything else as is. Decoders built from YAML or in Python see the same."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def field_defaults(cls) -> dict:
    """The defaults of a dataclass's constructor fields that a config can hold (numbers, text, flags, null, lists,
    mappings; not objects such as a default compression), as plain values: what a config that sets nothing gets."""
    out = {}
    for f in dataclasses.fields(cls):
        value = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if f.init and value is not dataclasses.MISSING and _holdable(value):
            out[f.name] = plain(value)
    return out


def _holdable(value: Any) -> bool:
    if isinstance(value, Mapping):
        return all(_holdable(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_holdable(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))
