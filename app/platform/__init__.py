"""The platform every feature stands on: settings, the database, migrations, crypto, logs and metrics, backups."""
