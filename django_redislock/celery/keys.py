"""Lock keys of task calls, derived from the task's run signature.

Celery calls a task as ``task(*args, **kwargs)`` without ``self``, even for ``bind=True`` tasks
and class-based tasks whose ``run`` takes ``self``; the key of a call must be the same whether an
argument was passed by position, by keyword or left to its default. So the key function binds the
call against a *view* of ``run`` whose signature is the call signature.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from celery import Task
from celery.contrib.django.task import DjangoTask

from django_redislock.naming import argument_digest, compile_key

__all__ = ["KeyFunction", "key_function"]

#: ``(task, args, kwargs) -> lock key``.
KeyFunction = Callable[[Any, tuple[Any, ...], dict[str, Any]], str]


def _call_view(run: Callable[..., Any], bound: bool) -> Callable[..., Any]:
    """A stand-in for ``run`` whose signature is the task's call signature (no ``self``)."""
    signature = inspect.signature(run)
    if bound:
        params = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=params)

    def view(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError

    view.__signature__ = signature  # type: ignore[attr-defined]
    view.__module__ = getattr(run, "__module__", None) or __name__
    view.__qualname__ = getattr(run, "__qualname__", getattr(run, "__name__", "run"))
    view.__name__ = getattr(run, "__name__", "run")
    return view


def _run_function(cls: type) -> tuple[Callable[..., Any], bool] | None:
    """The task body and whether it takes ``self`` (bind=True / class-based), or None (abstract)."""
    for klass in cls.__mro__:
        if "run" in klass.__dict__:
            if klass is Task or klass is DjangoTask:
                return None
            attr = klass.__dict__["run"]
            if isinstance(attr, staticmethod):
                return attr.__func__, False
            if isinstance(attr, classmethod):
                return attr.__func__, True
            return attr, True
    return None


def key_function(cls: type, key: Any) -> KeyFunction | None:
    """``(task, args, kwargs) -> lock key`` for the task class, or None for an abstract class.

    Templates are validated here (unknown parameter: ``ValueError``), i.e. when Celery creates the
    task class.
    """
    found = _run_function(cls)
    if found is None:
        return None
    run, bound = found
    view = _call_view(run, bound)
    if key is not None:
        name_of = compile_key(key, view)
        return lambda task, args, kwargs: name_of(*args, **kwargs)
    signature = inspect.signature(view)

    def default_key(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        return f"{task.name}:{argument_digest(arguments.arguments)}"

    return default_key
