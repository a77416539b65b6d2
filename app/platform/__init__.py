"""The platform every feature stands on: settings, the database, migrations, crypto, outbound URL checks, logs and
metrics, backups.

Every module here may be used by any package above it; none imports a feature.
"""

__all__ = [
    "audit", "backup", "bulk", "crypto", "db", "direct_sql", "errors", "formats", "healthcheck", "metrics", "migrate",
    "observability", "outbound", "settings",
]
