"""Annotation: the queue, a task, rankings and the pairs they expand into, step labels, and which prompt comes next."""
