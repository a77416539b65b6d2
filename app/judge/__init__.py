"""The AI judge and machine labels: model endpoints, sampling, judge runs, Monte-Carlo step labels, revisions.

Other packages use `endpoints` (an admin's model servers, turned into generators), `sampling`, `steps` and
`monte_carlo`; the app mounts `routes` and `endpoint_routes`; the worker runs `judge_job`, `monte_carlo_job`,
`revise_job` and `sample_job`.
"""

__all__ = ["endpoint_routes", "endpoints", "judge_job", "monte_carlo", "monte_carlo_job", "revise_job", "routes",
           "sample_job", "sampling", "steps"]
