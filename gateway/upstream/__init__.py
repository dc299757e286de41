"""The client side: one connection per upstream server (its life, reconnects and invocations), the
transports under `transports/`, the pool of dialled-in workers, offers, OAuth tokens toward servers, and the
sandbox stdio servers run in."""
