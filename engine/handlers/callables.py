"""The registry of task callables: the only functions a ``python`` task may call.

The deployment lists them by full dotted name in ``FLOWFORGE_TASK_CALLABLES``. Every
process builds the registry once at start-up (``engine.apps.EngineConfig.ready``): each
name is imported and must be a plain Python function defined under exactly that name,
or the process refuses to start. After that nothing is imported on anyone's behalf:
definition validation checks that a name is a key of the registry, and a run calls the
function the registry holds.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from types import FunctionType

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

SETTING = "FLOWFORGE_TASK_CALLABLES"

_registry: dict[str, FunctionType] = {}


def _kind(obj: object) -> str:
    """A few words saying what ``obj`` is, for an error message."""
    if inspect.isclass(obj):
        return f"a class ({obj.__module__}.{obj.__qualname__})"
    if inspect.ismodule(obj):
        return "a module"
    if inspect.isbuiltin(obj):
        return "a builtin"
    if inspect.ismethod(obj):
        return "a bound method"
    return f"an object of type {type(obj).__name__}"


def _resolve(name: str) -> FunctionType:
    """Import ``name`` ("package.module.function") and return the function.

    Raises ImproperlyConfigured naming the entry when the module cannot be imported, it
    has no such attribute, or the attribute is not a plain function defined under that
    very name (a class, a builtin, a method, a lambda, a re-exported alias, ``__class__``).
    """
    module_name, _, attr = name.rpartition(".")
    if not module_name or not attr:
        raise ImproperlyConfigured(
            f"{SETTING} entry {name!r} is not a full dotted name like 'package.module.function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"{SETTING} entry {name!r}: cannot import module {module_name!r} ({exc})"
        ) from exc
    if not hasattr(module, attr):
        raise ImproperlyConfigured(f"{SETTING} entry {name!r}: module {module_name!r} has no {attr!r}")
    fn = getattr(module, attr)
    if not inspect.isfunction(fn):
        raise ImproperlyConfigured(
            f"{SETTING} entry {name!r} is {_kind(fn)}, not a plain Python function; list functions "
            f"defined with 'def' at module level only"
        )
    # The name must be the function's own: a function imported into another module, or
    # made by a factory, would otherwise be callable under names nobody reviewed.
    if fn.__module__ != module_name or fn.__qualname__ != attr:
        raise ImproperlyConfigured(
            f"{SETTING} entry {name!r} is the function {fn.__module__}.{fn.__qualname__}; "
            f"register it under that name"
        )
    return fn


def load(names: Iterable[str]) -> dict[str, FunctionType]:
    """Resolve and check every name of ``names`` and make them the registry.

    Returns the new registry (name -> function). Raises ImproperlyConfigured naming the
    first bad entry; the registry is then left as it was.
    """
    resolved = {name: _resolve(name) for name in names}
    _registry.clear()
    _registry.update(resolved)
    return dict(_registry)


def lookup(name: str) -> Callable | None:
    """The registered function called ``name`` exactly, or None. Never imports anything."""
    return _registry.get(name)


def registered_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(_registry)


@receiver(setting_changed)
def _reload_on_override(*, setting: str, value, **kwargs) -> None:
    """Tests that override FLOWFORGE_TASK_CALLABLES get the registry of the new value."""
    if setting == SETTING:
        load(value or [])
