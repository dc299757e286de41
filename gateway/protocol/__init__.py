"""The wire and its vocabulary: JSON-RPC framing, the rules of each protocol era, URI templates, OAuth
metadata addresses, the gateway's naming rules, and the failures a call or a connection can end in."""
