"""Imports: prompts with completions, or finished pairs, read from files into a project, all or nothing.

Other packages use `service` (import a file into a project) and `formats` (its error type).
"""

__all__ = ["formats", "service"]
