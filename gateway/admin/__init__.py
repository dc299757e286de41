"""Operators' HTTP handlers: the admin API (servers, pins, workers) and the health probes."""
