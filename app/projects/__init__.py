"""Projects: their members, versioned rubrics and constitutions, gold tasks, and bulk inserts of their rows."""
