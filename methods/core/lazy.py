"""Deferred imports, so that reading the configuration never pays for torch.

The Snakefile resolves and validates every job's settings at parse time, and for that it imports
each method's module to read its ``Config``.  Importing torch takes about 2 s on the 2-core
reference machine and transformers and faiss as much again, against Snakemake's own 1.6 s, so
the modules on that path (the method modules, :mod:`methods.losses`, :mod:`methods.divergences`,
:mod:`methods.core.distill`, :mod:`methods.core.batch`, ...) bind torch with
``torch = lazy_import("torch")``: the module object is created at once and executed on the first
attribute access, by which time a job is running (importlib's ``LazyLoader`` recipe); their
``@torch.no_grad()`` is :func:`no_grad`.  Code that needs torch at import time (an ``nn.Module``
subclass) stays in modules that the methods import inside the functions that use them.
``tests/test_core.py`` checks that resolving the shipped grid loads neither torch nor transformers.

Where torch was imported before (every job entry point, the tests, verl's workers), the real
module is returned and nothing is deferred.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["lazy_import", "no_grad"]


def lazy_import(name: str) -> ModuleType:
    """Module ``name``: the loaded one if it is in ``sys.modules``, else one that loads on first use."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    if spec.loader is None:
        raise ModuleNotFoundError(f"module {name!r} has no loader (a namespace package?)", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def no_grad(fn: Callable) -> Callable:
    """``@torch.no_grad()`` for modules that bind torch lazily: torch is touched when ``fn`` runs,
    not when the module is imported (the decorator itself would load it)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import torch

        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper
