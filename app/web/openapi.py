"""The API's contract, decided in one place: the error answers every operation documents, the links between
operations, short operationIds, JSON Schema's own names for bounds, file parts that OpenAPI 3.0 readers know, the
`Allow` header of a 405, and the `/api/v1` prefix (`install` makes `app.openapi()` return it and serves it at /docs;
`create_app` calls it).

Routes declare only what is particular to them (`responses={410: ...}`); the rest is read from the route itself, so
a new route is documented truthfully without a line of its own:

- 401 when the operation needs a caller (`CurrentUser` and the aliases built on it): no, a bad or a revoked token;
- 403 when it needs a caller and names an object, writes, or needs an account role: the role lacks the action, or
  a browser request came without its CSRF token;
- 404 when it has a path parameter: no such object, or one the caller may not see;
- 409 when it writes (POST, PUT, PATCH, DELETE) with a body or a path parameter: a stale base version, a duplicate,
  a state that forbids it;
- 400 and 413 when it takes a body: not JSON (or not the declared media type); larger than PREFLAB_MAX_UPLOAD_MB;
- 422 when it takes any parameter or a body: a value the request model or the service refuses.

Each is answered with the one error body, `Error`: `{"detail": [{"field", "message", "line"?}]}`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.responses import Response
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from starlette.types import ASGIApp, Receive, Scope, Send

from app.web.deps import OptionalUser, api_user
from app.web.rendering import render

API_PREFIX = "/api"
VERSION_PREFIX = "/api/v1"
"""The versioned prefix the schema documents; `/api/...` is the same API under its first, unversioned name."""

UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}

ERROR_DESCRIPTIONS = {
    400: "The body could not be read: not JSON, or not the declared media type",
    401: "Not authenticated: no token, or an invalid or revoked one (`WWW-Authenticate: Bearer`)",
    403: "The caller's role does not allow this, or a browser request without its CSRF token",
    404: "No such object, or one the caller may not see (the two are indistinguishable on purpose)",
    409: "The request conflicts with the current state: a stale base version, a duplicate, a finished job",
    410: "Gone: the object was deleted",
    413: "The request body is larger than the server accepts (PREFLAB_MAX_UPLOAD_MB)",
    422: "A value was refused: `detail` names each field (and, for files, the line)",
    429: "Too many attempts: wait for the `Retry-After` seconds",
    503: "Not ready",
}

ERROR_ITEM = {
    "title": "ErrorItem", "type": "object", "required": ["message"],
    "properties": {
        "field": {"type": "string", "title": "Field", "description": "The offending field, dotted (`rubric.text`)"},
        "message": {"type": "string", "title": "Message", "description": "What is wrong, in words"},
        "line": {"type": "integer", "minimum": 0, "title": "Line",
                 "description": "For files: the 1-based line (0: a summary of further problems)"},
    },
}
ERROR_BODY = {
    "title": "Error", "type": "object", "required": ["detail"],
    "properties": {"detail": {"type": "array", "items": {"$ref": "#/components/schemas/ErrorItem"}}},
    "description": "Every error answer of the API: one item per problem.",
}
_ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


# --- which errors an operation can answer --------------------------------------------------------------------------


def _calls(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


def _path_params(dependant: Dependant) -> bool:
    return bool(dependant.path_params) or any(_path_params(sub) for sub in dependant.dependencies)


def _query_params(dependant: Dependant) -> bool:
    return bool(dependant.query_params) or any(_query_params(sub) for sub in dependant.dependencies)


def api_routes(app: FastAPI) -> list[RouteContext]:
    """Every route of the app with its full path (routers are included lazily: `app.routes` nests them)."""
    return [rc for rc in iter_route_contexts(app.routes) if isinstance(rc.original_route, APIRoute)]


NEEDS_CALLER: dict[int | str, dict[str, Any]] = {401: {"description": ERROR_DESCRIPTIONS[401]}}
"""`responses=` for a route that authenticates inside its handler rather than through `CurrentUser` (the hot
annotation routes): it is then documented as any authenticated route is."""


def _account_role(route: RouteContext) -> bool:
    """Whether the route needs an account role (`app.web.deps._account_action`: AdminUser, EndpointAdmin, …)."""
    return any(getattr(call, "account_action", None) for call in _calls(route.dependant))


def authenticated(route: RouteContext) -> bool:
    """Whether the route needs a caller: through `CurrentUser` or an account role, or by declaring NEEDS_CALLER."""
    return (api_user in set(_calls(route.dependant)) or _account_role(route)
            or 401 in route.responses or "401" in route.responses)


def error_statuses(route: RouteContext) -> set[int]:
    """The error statuses the route can answer, read from its parameters, body, method and dependencies."""
    authenticated_ = authenticated(route)
    account_role = _account_role(route)
    has_path = _path_params(route.dependant)
    has_body = route.body_field is not None
    writes = bool((route.methods or set()) & UNSAFE)
    codes: set[int] = set()
    if authenticated_:
        codes.add(401)
        if has_path or writes or account_role:
            codes.add(403)
    if has_path:
        codes.add(404)
    if writes and (has_body or has_path):
        codes.add(409)
    if has_body:
        codes |= {400, 413}
    if has_body or has_path or _query_params(route.dependant):
        codes.add(422)
    return codes | {int(s) for s in route.responses if str(s).isdigit() and 400 <= int(s) < 500}


def _document_errors(schema: dict[str, Any], routes: list[RouteContext]) -> None:
    by_operation = {(m.lower(), r.path_format): r for r in routes for m in r.methods or ()}
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            route = by_operation.get((method, path))
            if route is None:
                continue
            responses = operation.setdefault("responses", {})
            for status in sorted(error_statuses(route)):
                answer = responses.setdefault(str(status), {})
                answer["description"] = (answer.get("description") if answer.get("description") not in
                                         (None, "", "Validation Error") else ERROR_DESCRIPTIONS.get(status, "Error"))
                answer["content"] = _ERROR_CONTENT
            if authenticated(route):
                operation["security"] = [{"bearer": []}]
                responses["401"]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"},
                                                                    "description": "`Bearer`"}}
    schema.setdefault("components", {})["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer",
        "description": "A personal token (`preflab token create EMAIL`); browsers use the session cookie instead."}}
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["ErrorItem"] = ERROR_ITEM
    schemas["Error"] = ERROR_BODY


# --- operation ids ---------------------------------------------------------------------------------------------


def _short_operation_ids(schema: dict[str, Any], routes: list[RouteContext]) -> None:
    """A generated client's method names: the handler's own name (`create_project`, `submit_ranking`) rather than
    FastAPI's `create_project_api_projects_post`; a name two handlers share keeps FastAPI's unique form."""
    by_operation = {(m.lower(), r.path_format): r.name for r in routes for m in r.methods or ()}
    operations = [(by_operation.get((method, path)), op) for path, ops in schema.get("paths", {}).items()
                  for method, op in ops.items()]
    counts: dict[str, int] = {}
    for name, _ in operations:
        if name:
            counts[name] = counts.get(name, 0) + 1
    for name, op in operations:
        if name and counts[name] == 1:
            op["operationId"] = name


# --- constraints ---------------------------------------------------------------------------------------------------

_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _json_schema_bounds(node: Any) -> None:
    """pydantic writes a bound it cannot attach to the core type (one behind a validator, like `schemas.Int`'s) as
    its own keyword (`ge`); JSON Schema's is `minimum`."""
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            for ours, theirs in _BOUNDS.items():
                if ours in node:
                    node[theirs] = node.pop(ours)
        for value in node.values():
            _json_schema_bounds(value)
    elif isinstance(node, list):
        for value in node:
            _json_schema_bounds(value)


def _binary_uploads(node: Any) -> None:
    """A file part (`UploadFile`) says so in OpenAPI 3.0's words too, `format: binary`, beside 3.1's
    `contentMediaType`: generators that read only the former (openapi-python-client 0.29:
    https://github.com/openapi-generators/openapi-python-client/issues/1417) would
    otherwise type the part as text and send it without a file name, which the upload refuses."""
    if isinstance(node, dict):
        if node.get("type") == "string" and node.get("contentMediaType") == "application/octet-stream":
            node.setdefault("format", "binary")
        for value in node.values():
            _binary_uploads(value)
    elif isinstance(node, list):
        for value in node:
            _binary_uploads(value)


# --- links: what one operation's answer feeds into the next --------------------------------------------------------

_PARAM = re.compile(r"{(\w+)(?::\w+)?}")


def _response_properties(schema: dict[str, Any], operation: dict[str, Any]) -> tuple[str, set[str]] | None:
    """(status, top-level property names) of the operation's success answer whose body is one object."""
    components = schema.get("components", {}).get("schemas", {})
    for status, answer in operation.get("responses", {}).items():
        if not status.startswith("2"):
            continue
        body = answer.get("content", {}).get("application/json", {}).get("schema", {})
        ref = body.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            props = components.get(ref.rsplit("/", 1)[1], {}).get("properties", {})
            return status, set(props)
    return None


def _produces(path: str, props: set[str], paths: dict[str, Any]) -> dict[str, str]:
    """Path parameter → where the answer holds its value: `foo_id` properties by name, and `id` for the parameter
    of the item path under a collection that was just posted to (`POST /projects` → `/projects/{project_id}`)."""
    out = {p: f"$response.body#/{p}" for p in props if p.endswith("_id")}
    if "id" in props:
        for other in paths:
            match = re.fullmatch(re.escape(path) + r"/{(\w+)}", other)
            if match:
                out.setdefault(match.group(1), "$response.body#/id")
    return out


def _add_links(schema: dict[str, Any]) -> None:
    paths = schema.get("paths", {})
    for path, operations in paths.items():
        for method, operation in operations.items():
            found = _response_properties(schema, operation)
            if method not in ("post", "put") or found is None:
                continue
            status, props = found
            given = {p: f"$request.path.{p}" for p in _PARAM.findall(path)} | _produces(path, props, paths)
            links = {}
            for target_path, targets in paths.items():
                needed = _PARAM.findall(target_path)
                fresh = [p for p in needed if given.get(p, "").startswith("$response")]
                if not needed or not fresh or not all(p in given for p in needed):
                    continue
                for target_method, target in targets.items():
                    if (target_path, target_method) == (path, method):
                        continue
                    links[target["operationId"]] = {"operationId": target["operationId"],
                                                    "parameters": {p: given[p] for p in needed}}
            if links:
                operation["responses"][status]["links"] = links


# --- versioning ------------------------------------------------------------------------------------------------------


def _versioned_paths(schema: dict[str, Any]) -> None:
    schema["paths"] = {(VERSION_PREFIX + p[len(API_PREFIX):] if p.startswith(API_PREFIX + "/") else p): ops
                       for p, ops in schema.get("paths", {}).items()}


class VersionPrefix:
    """`/api/v1/...` is served by the routes registered as `/api/...`; the unversioned `/api/...` keeps working
    for the scripts written before the prefix, with `Deprecation` and a `Link` to its versioned name."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == VERSION_PREFIX or path.startswith(VERSION_PREFIX + "/"):
            scope = dict(scope, path=API_PREFIX + path[len(VERSION_PREFIX):])
            if scope.get("raw_path"):
                scope["raw_path"] = API_PREFIX.encode() + scope["raw_path"][len(VERSION_PREFIX):]
        elif path.startswith(API_PREFIX + "/"):
            successor = f'<{VERSION_PREFIX}{path[len(API_PREFIX):]}>; rel="successor-version"'.encode()

            async def send_deprecated(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", []), (b"deprecation", b"true"),
                                          (b"link", successor)]
                await send(message)

            await self.app(scope, receive, send_deprecated)
            return
        await self.app(scope, receive, send)


# --- 405 ---------------------------------------------------------------------------------------------------------


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route serves at this path (Starlette's own 405 names only the first route's)."""
    path = scope.get("path", "")
    methods: set[str] = set()
    for route in iter_route_contexts(app.routes):
        regex = getattr(route, "path_regex", None)
        if route.methods and regex is not None and regex.match(path):
            methods |= route.methods
    return sorted(methods)


# --- the schema --------------------------------------------------------------------------------------------------


def install(app: FastAPI) -> None:
    """Make `app.openapi()` return the contract: errors documented, links added, paths under `/api/v1`."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            routes = [r for r in api_routes(app) if r.include_in_schema]
            _document_errors(schema, routes)
            _short_operation_ids(schema, routes)
            _json_schema_bounds(schema)
            _binary_uploads(schema)
            _add_links(schema)
            _versioned_paths(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def docs_page(request: Request, user: OptionalUser) -> Response:
        """Swagger UI over /openapi.json, for everyone (the schema is public): `user` only fills the page's header."""
        return render(request, "api_docs.html")

    # Not FastAPI's own /docs: it loads Swagger UI from a CDN with an inline script, both refused by the CSP.
    app.add_api_route("/docs", docs_page, methods=["GET"], include_in_schema=False)
