"""The request toolkit every feature's routes use: dependencies, rendering, CSRF cookies, forms, fragments, OpenAPI.

Feature routes use `deps`, `rendering`, `forms`, `form_pages` and `fragments`; the app factory also mounts
`health_routes` and installs `openapi`; `preflab serve` uses `serving` and `balance`.
"""

__all__ = ["balance", "deps", "form_pages", "forms", "fragments", "health_routes", "openapi", "rendering", "serving"]
