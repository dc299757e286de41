"""What is offered, before anyone asks: the merged catalog under public names (`merged`), trust labels,
allow/deny filters, deferred exposure and the tool search."""
