"""Lock names from function calls: key templates, key callables, stable argument digests.

Shared by :func:`~django_redislock.distributed_lock`, ``LockedCommand`` and the Celery
``SingleFlightTask``: a template is checked against the function's signature once, when the
function is decorated (or the task class created), so a typo fails at import time, not at 3 a.m.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import functools
import hashlib
import inspect
import json
import re
import string
import uuid as uuid_module
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["KeySpec", "argument_digest", "compile_key", "stats_shape", "template_fields"]

KeySpec = str | Callable[..., str] | None


def template_fields(template: str) -> list[str]:
    """The root names a ``str.format`` template refers to (``"{options[x]}"`` -> ``options``).

    Fields nested in a format spec count too (``"{x:>{width}}"`` -> ``x``, ``width``):
    ``str.format`` fills them from the same arguments, so a typo there must fail at decoration
    like any other field (issue 27). ``str.format`` allows one level of nesting; a template
    nested deeper, a positional field (``{}``, ``{0}``), an unknown conversion or a malformed
    template raises ``ValueError`` naming the template, instead of failing at every call.
    """
    roots: list[str] = []
    _collect_fields(template, template, roots, nested=False)
    return roots


def _collect_fields(text: str, template: str, roots: list[str], *, nested: bool) -> None:
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(
            f"Lock key template {template!r} is not a valid str.format template: "
            f"{str(exc).rstrip('.')}."
        ) from None
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if conversion not in (None, "r", "s", "a"):
            raise ValueError(
                f"Lock key template {template!r} uses the conversion !{conversion}; only !r, !s "
                "and !a exist."
            )
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValueError(
                f"Lock key template {template!r} uses a positional field {{{field}}}; name the "
                "parameter instead, e.g. '{invoice_id}'."
            )
        roots.append(root)
        if spec and "{" in spec:
            if nested:
                raise ValueError(
                    f"Lock key template {template!r} has a field nested in the format spec of "
                    f"{{{field}}}, which is itself nested in a format spec; str.format allows "
                    "one level of nesting."
                )
            _collect_fields(spec, template, roots, nested=True)


def compile_key(
    key: KeySpec, func: Callable[..., Any], *, skip: tuple[str, ...] = ()
) -> Callable[..., str]:
    """Turn a key spec into ``name(*args, **kwargs) -> str`` for calls of ``func``.

    Templates are checked *now*: a field naming no parameter of ``func`` raises ``ValueError``
    at decoration time instead of at the first call in production. ``skip`` lists parameters that
    templates must not use (e.g. ``self`` of a bound Celery task).
    """
    if key is None:
        fixed = f"{func.__module__}.{func.__qualname__}"
        return lambda *args, **kwargs: fixed
    if callable(key):
        key_func = key

        def from_callable(*args: Any, **kwargs: Any) -> str:
            name = key_func(*args, **kwargs)
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"Lock key callable {key_func!r} returned {name!r}, not a non-empty str"
                )
            return name

        return from_callable
    if not isinstance(key, str) or not key:
        raise TypeError(f"Lock key must be a str template, a callable or None, not {key!r}")
    signature = inspect.signature(func)
    params = set(signature.parameters) - set(skip)
    unknown = [f for f in dict.fromkeys(template_fields(key)) if f not in params]
    if unknown:
        raise ValueError(
            f"Lock key template {key!r} names {', '.join(repr(u) for u in unknown)}, which "
            f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'} of "
            f"{func.__qualname__}{signature}."
        )

    def from_template(*args: Any, **kwargs: Any) -> str:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        try:
            return key.format(**bound.arguments)
        except (AttributeError, LookupError, TypeError, ValueError) as exc:
            raise ValueError(_fill_error(key, func, bound.arguments, exc)) from exc

    return from_template


def _fill_error(
    template: str, func: Callable[..., Any], arguments: Mapping[str, Any], exc: Exception
) -> str:
    """Why ``template`` could not be filled from a call's ``arguments``: the template, the field
    and the argument, in one sentence (instead of a bare ``AttributeError: 'int' object has no
    attribute 'pk'`` from deep inside the decorator)."""
    formatter = string.Formatter()
    where = f"Lock key template {template!r} of {func.__qualname__}"
    for _, field, spec, _conversion in _all_fields(template):
        root = field.split(".", 1)[0].split("[", 1)[0]
        value = arguments.get(root)
        try:
            obj, _ = formatter.get_field(field, (), arguments)
            if spec and "{" not in spec:
                format(obj, spec)
        except (AttributeError, LookupError, TypeError, ValueError) as problem:
            said = f"no {type(problem).__name__[:-5].lower()} {problem}"
            if not isinstance(problem, LookupError):
                said = str(problem).rstrip(".")
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            return (
                f"{where} cannot fill {{{field}}} from argument {root}={shown} "
                f"({type(value).__name__}): {said}. Pass a value that has what the field asks "
                f"for, or change the template (e.g. '{{{root}}}')."
            )
    return f"{where} cannot be filled from the call's arguments: {exc}"


def _all_fields(text: str) -> list[tuple[str, str, str, str | None]]:
    """``(literal, field, spec, conversion)`` of every field of a template, nested ones too."""
    found: list[tuple[str, str, str, str | None]] = []
    for literal, field, spec, conversion in string.Formatter().parse(text):
        if field is None:
            continue
        found.append((literal, field, spec or "", conversion))
        if spec and "{" in spec:
            found += _all_fields(spec)
    return found


def _canonical(value: Any) -> Any:
    """A JSON-ready form of ``value`` that is equal for equal arguments, in any process.

    Dicts and sets are ordered, tuples become lists, and the types Celery's JSON serializer
    round-trips (UUID, Decimal, datetime, date, time) are reduced to their text, so the key computed
    from the caller's arguments equals the one computed from the decoded message in the worker.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if value == value else "NaN"
    if isinstance(value, enum.Enum):
        return _canonical(value.value)
    if isinstance(value, uuid_module.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return str(value.normalize()) if value.is_finite() else str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc)
        return value.isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__bytes__": bytes(value).hex()}
    if isinstance(value, Mapping):
        items = [
            (k if isinstance(k, str) else _dumps(_canonical(k)), _canonical(v))
            for k, v in value.items()
        ]
        return {k: v for k, v in sorted(items, key=lambda kv: kv[0])}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=_dumps)
    raise TypeError(
        f"Cannot derive a stable lock key from an argument of type {type(value).__name__}: pass "
        "lock_key= (a template or a callable) to SingleFlightTask."
    )


def _dumps(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True
    )


def argument_digest(arguments: Mapping[str, Any]) -> str:
    """Stable hex digest of bound arguments (name -> value); order of keys never matters."""
    data = _dumps(_canonical(dict(arguments))).encode("utf-8")
    return hashlib.blake2b(data, digest_size=16).hexdigest()


_SHAPES = (
    (
        re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
        "{uuid}",
    ),
    (re.compile(r"(?<![0-9a-zA-Z])[0-9a-fA-F]{16,}(?![0-9a-zA-Z])"), "{hex}"),
    (re.compile(r"\d+"), "{n}"),
)


@functools.lru_cache(maxsize=4096)
def stats_shape(name: str) -> str:
    """The statistics name of a plain lock name: its ids replaced by placeholders.

    ``Lock(f"invoice:{pk}")`` would otherwise keep statistics per invoice — one Redis hash per
    name for a day — where ``invoice:{n}`` aggregates them. Decorated functions and tasks use their
    key template instead; ``stats_name=`` chooses explicitly.
    """
    for pattern, placeholder in _SHAPES:
        name = pattern.sub(placeholder, name)
    return name
