"""The rules the server enforces that JSON Schema cannot state, each with its reason: the only grounds on which
`make api-check` lets a schema-valid request be refused (Schemathesis' `positive_data_acceptance`).

Nearly all are about what is stored, which no schema of one request can know: an id or an email must name an
object that exists and belongs where the request says; an object must be in a state that allows the step. The
answer is always a 4xx naming the field, never a 5xx.

Each entry: (operation, a phrase of the refusal's message, the reason). The operation is as Schemathesis labels
it (`METHOD /api/v1/path`); `*` stands for every operation.
"""

from __future__ import annotations

EXCEPTIONS: list[tuple[str, str, str]] = [
    # References to stored objects.
    ("*", "does not exist", "a local model directory (generator.model, base_model) must exist on the server"),
    ("POST /api/v1/projects/{project_id}/members", "no user with email",
     "the email must be an existing account's"),
    ("GET /api/v1/projects/{project_id}/agreement", "has no rubric version", "the rubric version must exist"),
    ("*", "no such export in this project", "export_id must name an export of this project"),
    ("*", "no such", "an id in the body must name an object of this project"),
    ("*", "no cluster named", "where must name a cluster an admin configured (stored, not in the schema)"),
    ("*", "is not one of this prompt's completions", "completion ids must be the prompt's own"),
    ("POST /api/v1/projects/{project_id}/rankings", "does not match the task", "prompt_id must be the task's"),
    ("POST /api/v1/projects/{project_id}/rankings", "completion", "tiers must hold the task's completions"),
    ("*", "constitution version", "the constitution version must exist"),
    ("*", "rubric version", "rubric_version must be the project's current version"),
    ("*", "the rubric changed", "rubric_version must be the project's current version (a stale task's answer)"),
    # State that allows the step.
    ("GET /api/v1/exports/{export_id}/files/{name}", "was deleted", "a deleted export's files are gone (410)"),
    ("GET /api/v1/exports/{export_id}/files/{name}", "no file", "the file must be one the export wrote"),
    ("POST /api/v1/training-runs/{run_id}/human-check", "only a finished reward-model run",
     "only a finished reward-model run can be checked"),
    ("POST /api/v1/training-runs/{run_id}/iterate", "iterate from a finished", "only a finished policy run iterates"),
    ("POST /api/v1/training-runs/{run_id}/sample-into-project", "only policy runs", "only a policy run samples"),
    ("POST /api/v1/training-runs/{run_id}/sample-into-project", "finished", "only a finished run samples"),
    ("PUT /api/v1/projects/{project_id}/ai-labels", "AI labels cannot be allowed yet",
     "allowing AI labels needs measured judge-human agreement (the evidence gate)"),
    ("PUT /api/v1/projects/{project_id}/ai-step-labels", "AI step labels cannot be allowed yet",
     "allowing AI step labels needs measured judge-human step agreement (the evidence gate)"),
    ("*", "no prompts", "the project must hold prompts for a job to work on"),
    ("*", "this project does not label steps", "step labels need the project's step option on"),
    ("POST /api/v1/projects/{project_id}/priority-jobs", "only a finished reward-model run can score prompts",
     "priorities from a reward run need that run finished"),
    ("POST /api/v1/projects/{project_id}/priority-jobs", "serves prompts in random order",
     "priorities need the project's selection set to uncertainty or disagreement first"),
    ("POST /api/v1/projects/{project_id}/priority-jobs", "uncertainty needs a finished reward-model run",
     "uncertainty priorities score prompts with the project's reward model: one must have finished (stored state)"),
    ("POST /api/v1/projects/{project_id}/revision-jobs", "no principle has both a critique and a revision",
     "revisions need a constitution principle with a critique and a revision request"),
    ("PUT /api/v1/assignments/{assignment_id}/draft", "completion", "a draft holds the task's own completions"),
    ("*", "must be at most the project's K", "k is bounded by the project's own K"),
    ("POST /api/v1/projects/{project_id}/mc-step-labels", "reference answer",
     "Monte-Carlo step labels need prompts with a reference answer to check continuations against"),
    ("POST /api/v1/projects/{project_id}/mc-step-labels", "not found (no config.json there)",
     "the policy's model directory must exist on the server"),
    ("POST /api/v1/projects/{project_id}/mc-step-labels", "no completions to label",
     "the prompts in scope must hold completions"),
    ("POST /api/v1/projects/{project_id}/mc-step-labels", "not prompts of this project",
     "prompt_ids must name prompts of this project"),
    ("POST /api/v1/projects/{project_id}/mc-step-labels", "would sample",
     "a run's cost, n × (steps − 1) over its completions, depends on the stored completions and is capped"),
    ("*", "this export was deleted", "a deleted export trains nothing"),
    ("*", "local is built in", "`local` names the worker's own host; a configured cluster takes another name"),
    # A cluster's fields depend on its kind (a rule across fields), and its defaults on the run resources.
    ("*", "a Ray cluster needs its head's dashboard address", "a Ray cluster's kind asks for an http(s) address"),
    ("*", "a partition is Slurm's", "a Ray cluster has no partition"),
    ("*", "an address is Ray's", "a Slurm cluster has no address: it is reached through sbatch"),
    ("*", "a login node is Slurm's", "a Ray cluster has no login node: it is reached at its address"),
    ("*", "is not a default resource here", "default resources are the run resources the backends take"),
    ("*", "must map variable names to text values", "env keys must be environment variable names"),
    ("*", "must be one line of at most 1000 characters", "an address or a partition is one line"),
    ("POST /api/v1/training-runs/{run_id}/iterate", "no finished reward-model run",
     "iterating needs the policy run's finished reward-model run"),
    ("*", "appears more than once", "a completion is in one tier only: uniqueItems cannot look across nested lists"),
    ("POST /api/v1/projects/{project_id}/rankings", "give assignment_id or prompt_id",
     "a ranking names its task by assignment_id or by prompt_id (a rule across fields)"),
    ("*", "not both", "a generator names endpoint_id or base_url, not both (a rule across fields)"),
    ("*", "the endpoint's own API key is used",
     "a generator naming an endpoint_id uses the key stored with it; an api_key beside it is refused (a rule across "
     "fields)"),
    ("*", "must name the model the server serves",
     "a generator given a base_url names its model; with an endpoint_id the endpoint's model is the default (a rule "
     "across fields)"),
    # Who the caller is.
    ("*", "pick a model endpoint", "only admins may name a server URL; everyone else picks an endpoint_id"),
    ("PATCH /api/v1/users/{user_id}", "you cannot deactivate yourself", "an admin may not lock themself out"),
    ("PATCH /api/v1/users/{user_id}", "you cannot change your own role", "an admin may not demote themself"),
    ("*", "outbound calls are switched off", "the checking server refuses every host (PREFLAB_OUTBOUND_HOSTS=none)"),
    # Rules across fields or items.
    ("POST /api/v1/projects/{project_id}/constitutions", "duplicate principle name",
     "principle names are unique: uniqueItems cannot compare one property of objects"),
    ("POST /api/v1/projects/{project_id}/exports", "only pairs exports", "aggregation applies to pairs exports only"),
    ("POST /api/v1/projects/{project_id}/exports", "only steps exports treat neutral steps",
     "`neutral` applies to steps exports only"),
    ("POST /api/v1/projects/{project_id}/exports", "only steps exports have steps to keep",
     "`every_step` applies to steps exports only"),
    ("POST /api/v1/projects/{project_id}/rankings", "rank at least two tiers",
     "a ranking that is not a skip needs two tiers or more (a rule across `skipped` and `tiers`)"),
    ("*", "filters", "export filters depend on the export kind"),
    ("*", "config", "a trainer config's fields depend on the run kind (`python -m training KIND --help`)"),
    # File contents.
    ("POST /api/v1/projects/{project_id}/imports", "", "an import file's rows must parse as JSONL, CSV or Parquet "
                                                      "with the documented columns: the schema sees only bytes"),
]


FORMATS_NOT_CLAIMED = {
    "email": "account emails are the pattern services.users.EMAIL_RE, stated as `pattern`: format checkers disagree "
             "with it and with each other (control characters, quoting, non-ASCII), so `format: email` would be a "
             "promise the server does not keep",
    "uri": "model server URLs (base_url) are checked by app.platform.outbound (http or https, a host, no "
           "credentials, no metadata or private address unless trusted), which RFC 3986 `format: uri` neither "
           "implies nor is implied by",
}
"""The formats the schema deliberately leaves out, and why (the issue asked for email and uri)."""


def _matches(pattern: str, operation: str) -> bool:
    return pattern == "*" or pattern == operation


DESIGNED: list[tuple[str, str, str]] = [
    ("DELETE /api/v1/exports/{export_id}", "use_after_free",
     "a deleted export is a tombstone: its files go, its row stays readable (status `deleted`, hashes, counts) so the "
     "lineage of the runs trained on it still resolves; its files answer 410"),
]
"""(operation, check, reason): checks whose premise the API rejects on purpose, for the reason given."""


def allowed(operation: str, check: str, message: str) -> bool:
    """Whether a failure is a refusal for a listed rule (only `positive_data_acceptance` failures may be), or a
    check the API's design rejects for that operation (DESIGNED)."""
    if any(_matches(op, operation) and check == name for op, name, _ in DESIGNED):
        return True
    return check == "positive_data_acceptance" and any(
        _matches(op, operation) and phrase in message.split("answered", 1)[-1] for op, phrase, _ in EXCEPTIONS)
