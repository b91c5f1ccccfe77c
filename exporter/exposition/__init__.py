"""From snapshot to scrape: the metric tables, the incremental renderer and the HTTP routes."""

from exporter.exposition.app import build_routes
from exporter.exposition.columns import Column, ScrapeTable, Table
from exporter.exposition.per_scrape import build_exposition, web_tables
from exporter.exposition.process import PROCESS, ProcessReader, ProcessReading
from exporter.exposition.render import Body, ExpositionCache, Renderer
from exporter.exposition.tables import LAYOUT, EngineRow, Placed, engine_rows
from exporter.exposition.text import sample_value

__all__ = [
    "LAYOUT",
    "PROCESS",
    "Body",
    "Column",
    "EngineRow",
    "ExpositionCache",
    "Placed",
    "ProcessReader",
    "ProcessReading",
    "Renderer",
    "ScrapeTable",
    "Table",
    "build_exposition",
    "build_routes",
    "engine_rows",
    "sample_value",
    "web_tables",
]
