"""preflab's Python client, shipped as the `preflab` package (`from preflab.client import Client`).

The source lives here, in app/client, and setuptools maps it to `preflab` (pyproject's package-dir); it imports
only the standard library and httpx (datasets, pandas and pyarrow lazily), never the rest of app.
"""
