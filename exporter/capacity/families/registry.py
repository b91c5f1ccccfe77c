"""The architecture registry: one small entry per model family, looked up by class name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exporter.capacity.families.layout import BuildContext, ModelLayout
from exporter.capacity.hf_config import HfConfig

LayoutBuilder = Callable[[HfConfig, BuildContext], ModelLayout]


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    build: LayoutBuilder


_FAMILIES: dict[str, Family] = {}


def register(name: str, *architectures: str) -> Callable[[LayoutBuilder], LayoutBuilder]:
    """Register a layout builder for the `architectures` of a family (class decorator style)."""

    def decorator(build: LayoutBuilder) -> LayoutBuilder:
        family = Family(name=name, architectures=architectures, build=build)
        for architecture in architectures:
            if architecture in _FAMILIES:
                raise RuntimeError(f"{architecture} is registered twice")
            _FAMILIES[architecture] = family
        return build

    return decorator


def lookup(architecture: str) -> Family | None:
    return _FAMILIES.get(architecture)


def supported_families() -> dict[str, tuple[str, ...]]:
    """Family name -> the architectures it covers, for error messages and docs."""
    families: dict[str, tuple[str, ...]] = {}
    for family in _FAMILIES.values():
        families[family.name] = family.architectures
    return families
