"""The request toolkit every feature's routes use: dependencies, rendering, CSRF cookies, forms, fragments, OpenAPI."""
