"""Typed payloads: dataclasses, pydantic models and other annotated values as JSON.

On the wire a payload stays plain JSON, so producers in any language can write it. Python
code may still pass a ``@dataclass`` or a pydantic model (any object with ``model_dump``)
and receive one back: :func:`to_jsonable` turns such values into JSON values when they are
encoded, and :func:`convert` turns a decoded JSON value into the type a signature asks for
(``def charge(order: Order) -> Receipt``). Conversion depends only on the bytes and the
annotation, so replay converts a recorded payload to the same value every time.

pydantic is never imported here: a model class is recognised by its ``model_validate``
method and an instance by ``model_dump``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta
from typing import Any

from engine.core.errors import CodecError

__all__ = ["convert", "parameter_type", "return_type", "to_jsonable"]

_NO_HINT: Any = inspect.Parameter.empty


def to_jsonable(value: Any) -> Any:
    """The JSON form of a value ``json`` cannot encode itself (``default=`` of ``json.dumps``).

    Dataclasses become objects of their fields, pydantic models their ``model_dump(mode=
    "json")``, enums their value, dates and times ISO 8601 strings, UUIDs strings, sets
    sorted lists. Anything else raises TypeError, as ``json`` expects.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        return dump(mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def convert(value: Any, hint: Any) -> Any:
    """``value`` (decoded JSON) as an instance of ``hint``; unannotated values pass through.

    Raises CodecError when the value cannot be read as that type.
    """
    if hint is _NO_HINT or hint is Any or hint is None or isinstance(hint, typing.TypeVar):
        return value
    try:
        return _convert(value, hint)
    except CodecError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise CodecError(
            f"cannot read {_short(value)} as {_name(hint)}: {exc}; check that the sender's "
            f"payload matches the annotation"
        ) from exc


def _convert(value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _convert(value, typing.get_args(hint)[0])
    if origin is typing.Union or origin is types.UnionType:
        return _union(value, typing.get_args(hint))
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise ValueError(f"expected one of {typing.get_args(hint)}")
        return value
    if origin is not None:
        return _generic(value, origin, typing.get_args(hint))
    if not isinstance(hint, type):
        return value
    return _concrete(value, hint)


def _union(value: Any, options: tuple[Any, ...]) -> Any:
    if value is None and type(None) in options:
        return None
    errors = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _convert(value, option)
        except (TypeError, ValueError, KeyError, AttributeError, CodecError) as exc:
            errors.append(str(exc))
    raise ValueError("; ".join(errors) or "no option of the union fits")


def _generic(value: Any, origin: Any, args: tuple[Any, ...]) -> Any:
    if origin in (list, set, frozenset) or _is_abc(origin, "Sequence", "Set", "Iterable"):
        item = args[0] if args else Any
        items = [convert(v, item) for v in _as_list(value)]
        return items if origin is list or not isinstance(origin, type) else origin(items)
    if origin is tuple:
        items = _as_list(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(convert(v, args[0]) for v in items)
        if args and len(args) != len(items):
            raise ValueError(f"expected {len(args)} items, got {len(items)}")
        return tuple(convert(v, t) for v, t in zip(items, args or [Any] * len(items), strict=True))
    if origin is dict or _is_abc(origin, "Mapping", "MutableMapping"):
        if not isinstance(value, Mapping):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        key_type, item_type = args if len(args) == 2 else (Any, Any)
        return {convert(k, key_type): convert(v, item_type) for k, v in value.items()}
    if isinstance(origin, type):
        return _concrete(value, origin)
    return value


def _is_abc(origin: Any, *names: str) -> bool:
    return getattr(origin, "__module__", "") == "collections.abc" and origin.__name__ in names


def _as_list(value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected an array, got {type(value).__name__}")
    return list(value)


def _concrete(value: Any, hint: type) -> Any:
    if dataclasses.is_dataclass(hint):
        return _dataclass(value, hint)
    validate = getattr(hint, "model_validate", None)
    if callable(validate):
        return validate(value)
    if issubclass(hint, enum.Enum):
        return hint(value)
    if hint is datetime or hint is date or hint is time:
        return value if isinstance(value, hint) else hint.fromisoformat(value)
    if hint is timedelta:
        return value if isinstance(value, timedelta) else timedelta(seconds=value)
    if hint is uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (set, frozenset, tuple):
        return hint(_as_list(value))
    if (
        value is not None
        and hint in (int, str, bool, float, list, dict)
        and not isinstance(value, hint)
    ):
        raise TypeError(f"expected {hint.__name__}, got {type(value).__name__}")
    return value


def _dataclass(value: Any, hint: type) -> Any:
    if isinstance(value, hint):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object for {hint.__name__}, got {type(value).__name__}")
    hints = _field_hints(hint)
    known = {f.name: f for f in dataclasses.fields(hint) if f.init}
    missing = [
        name
        for name, f in known.items()
        if name not in value
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    # Fields the class does not know (added by a newer sender) are left out, not refused.
    kwargs = {name: convert(value[name], hints.get(name, Any)) for name in known if name in value}
    return hint(**kwargs)


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # unresolvable forward references: convert those fields as plain JSON
        return {}


@functools.cache
def _hints(fn: Callable[..., Any]) -> tuple[list[Any], Any]:
    """Parameter annotations (positional order) and the return annotation of ``fn``."""
    try:
        resolved = typing.get_type_hints(fn, include_extras=True)
        params = list(inspect.signature(fn).parameters.values())
    except Exception:  # builtins, unresolvable names: no conversion rather than no call
        return [], _NO_HINT
    positional = [
        resolved.get(p.name, _NO_HINT)
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return positional, resolved.get("return", _NO_HINT)


def parameter_type(fn: Callable[..., Any], index: int) -> Any:
    """The annotation of ``fn``'s positional parameter ``index`` (unannotated: no type)."""
    positional, _ = _hints(fn)
    return positional[index] if index < len(positional) else _NO_HINT


def return_type(fn: Callable[..., Any]) -> Any:
    """The return annotation of ``fn`` (unannotated: no type)."""
    return _hints(fn)[1]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)
