"""A package's public names, imported from their modules on first use (PEP 562).

A command that needs one light module of a package (`capacity` reads a command line with
`exporter.collectors.parsing.vllm_args`) would otherwise pay for every module the package
re-exports: the state store, structlog, ZMQ, NVML.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_getattr(
    package: str, names: Mapping[str, Sequence[str]], *, load_all: bool = False
) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each name in `names` (module -> its names) is
    imported from its module when first asked for and kept in the package. `load_all`
    imports every module on the first name (modules that register themselves on import)."""
    home = {name: module for module, module_names in names.items() for name in module_names}
    namespace = importlib.import_module(package).__dict__

    def getattr_(name: str) -> Any:
        module = home.get(name)
        if module is None:
            # AttributeError lets `from package import submodule` import the submodule.
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if load_all:
            for every in names:
                importlib.import_module(every)
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return getattr_
