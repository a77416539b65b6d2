"""Exports: immutable pair and step datasets written from one database snapshot, with their card."""
