"""From snapshot to scrape: metric families, cached rendering and the HTTP routes."""

from exporter.exposition.render import ExpositionCache

__all__ = ["ExpositionCache"]
