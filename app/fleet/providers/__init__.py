"""Instance providers behind one interface; `ProviderRegistry` is the one place that picks them."""

from __future__ import annotations

from collections.abc import Callable

from app.config import Settings
from app.fleet.providers.base import Provider, ProviderError

_FACTORIES: dict[str, Callable[[Settings], Provider]] = {}


def _scaleway(settings: Settings) -> Provider:
    from app.fleet.providers.scaleway import ScalewayProvider  # the SDK loads only when used

    return ScalewayProvider(settings)


def _local(settings: Settings) -> Provider:
    from app.fleet.providers.local import LocalProvider

    return LocalProvider(settings)


_FACTORIES.update({"scaleway": _scaleway, "local": _local})


class ProviderRegistry:
    """Builds each provider on first use and keeps it (one SDK client per process)."""

    def __init__(
        self,
        settings: Settings,
        overrides: dict[str, Provider] | None = None,
    ) -> None:
        self._settings = settings
        self._built: dict[str, Provider] = dict(overrides or {})

    def __getitem__(self, name: str) -> Provider:
        if name not in self._built:
            factory = _FACTORIES.get(name)
            if factory is None:
                raise ProviderError(f"unknown provider {name!r}")
            self._built[name] = factory(self._settings)
        return self._built[name]


__all__ = ["Provider", "ProviderError", "ProviderRegistry"]
