"""What the gateway tells operators: structured logs (with redaction), Prometheus metrics, and the live feed
of tool calls. The lowest layer: it imports nothing else of the gateway."""
