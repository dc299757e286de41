"""What the operator writes: the server list (`servers`), process settings (`settings`), the shapes of
tokens, endpoints and OAuth rules (`access`), named credentials and `${VAR}` interpolation."""
