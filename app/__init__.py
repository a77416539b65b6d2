"""preflab web application: annotation, judging, exports and training runs over one database."""

__version__ = "0.1.0"
