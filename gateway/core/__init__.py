"""The hub: the registry of upstream servers and the catalog they make, conversation instances, servers
handed over at run time, and `forward`, which sends every request upstream."""
