"""The AI judge: model endpoints, sampling completions, judge runs on answers and on steps, and revisions.

Other packages use `endpoints` (an admin's model servers, turned into generators), `sampling` and `steps`; the app
mounts `routes` and `endpoint_routes`; the worker runs `judge_job`, `revise_job` and `sample_job`.
"""

__all__ = ["endpoint_routes", "endpoints", "judge_job", "revise_job", "routes", "sample_job", "sampling", "steps"]
