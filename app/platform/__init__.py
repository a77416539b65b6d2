"""The platform every feature stands on: settings, database, migrations, crypto, outbound checks, logs, backups.

Every module here may be used by any package above it; none imports a feature.
"""

__all__ = [
    "audit", "backup", "bulk", "crypto", "db", "direct_sql", "errors", "formats", "healthcheck", "metrics",
    "middleware", "migrate", "observability", "outbound", "settings",
]
