"""Helpers both `app` and `training` use: outbound connections under an address check, durable file writes."""
