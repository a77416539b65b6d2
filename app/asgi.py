"""`app.asgi:app` for uvicorn/gunicorn process managers: the app built from the environment's settings."""

from app.main import create_app

app = create_app()
