"""Reading a model's config.json from disk (the capacity model itself does no I/O)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exporter.errors import ConfigError


def load_model_config(path: Path) -> dict[str, Any]:
    """Read config.json from a file or a model directory."""
    file = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read {file}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{file} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file} must hold a JSON object")
    return data
