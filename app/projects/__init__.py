"""Projects: their members, and their versioned rubrics and constitutions.

Other packages use `projects` (find a visible project, its members and counts), `rubrics`, `constitutions` and
`versions`; the app mounts `api`, `pages` and `constitution_routes`.
"""

__all__ = ["api", "constitution_routes", "constitutions", "pages", "projects", "rubrics", "versions"]
