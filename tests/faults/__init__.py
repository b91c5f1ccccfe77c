"""Fault injection: the exporter against dying, restarting and misbehaving neighbours."""
