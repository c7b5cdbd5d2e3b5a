"""Argument checks of the public constructors: each says which condition failed and what is
allowed (durations are checked by :func:`django_redislock.conf.check_seconds`)."""

from __future__ import annotations

__all__ = ["MAX_NAME_LENGTH", "MAX_OWNER_LENGTH", "check_bool", "check_name", "check_owner"]

#: Longest name accepted: a longer one is almost surely data, not a name (hash it).
MAX_NAME_LENGTH = 4096
#: Longest owner id accepted (it is stored with every hold and every queue entry).
MAX_OWNER_LENGTH = 4096


def check_name(name: object, what: str = "Lock name") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{what} must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{what} is {len(name)} characters long; at most {MAX_NAME_LENGTH} are accepted "
            "(hash long variable parts into the name)"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} {name!r} cannot be encoded as UTF-8") from exc
    return name


def check_owner(owner: object) -> str | None:
    if owner is None:
        return None
    if not isinstance(owner, str):
        raise TypeError(f"owner must be a str or None, not {type(owner).__name__}")
    if not owner:
        raise ValueError("owner must not be empty (pass None for the default owner)")
    if len(owner) > MAX_OWNER_LENGTH:
        raise ValueError(
            f"owner is {len(owner)} characters long; at most {MAX_OWNER_LENGTH} are accepted "
            "(hash a long identity into the owner)"
        )
    if "\n" in owner:
        raise ValueError(f"owner must not contain a newline: {owner[:60]!r}")
    try:
        owner.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"owner {owner[:60]!r} cannot be encoded as UTF-8") from exc
    return owner


def check_bool(value: object, what: str, *, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, not {value!r}")
    return value
