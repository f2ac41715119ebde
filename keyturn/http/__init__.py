"""The HTTP front door: the ASGI app, its guard and request log, health and
metrics endpoints, and the playground."""
