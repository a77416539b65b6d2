"""Imports: prompts with completions, or finished pairs, read from files into a project, all or nothing."""
