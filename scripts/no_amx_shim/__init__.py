"""Not imported as a package: the folder goes on PYTHONPATH (mypy names its module apart)."""
