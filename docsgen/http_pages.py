"""docs/reference/http-publisher.md and http-sink.md, rendered from the OpenAPI
document each service ships in its package and serves at GET /openapi.json."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

from docsgen.markdown import GENERATED_NOTE, code, page, slug, table, text
from plumbing.openapi import OPENAPI_PATH, load_document

Json = dict[str, Any]
METHODS: Final = ("get", "head", "post", "put", "patch", "delete", "options")
# Keywords whose value is shown as it is, after a label.
_CONSTRAINTS: Final = (
    ("minimum", "minimum"),
    ("exclusiveMinimum", "above"),
    ("maximum", "maximum"),
    ("exclusiveMaximum", "below"),
    ("minLength", "min length"),
    ("maxLength", "max length"),
    ("minItems", "min items"),
    ("maxItems", "max items"),
    ("minProperties", "min properties"),
    ("maxProperties", "max properties"),
    ("format", "format"),
    ("pattern", "pattern"),
    ("default", "default"),
)
INTRO: Final = {
    "publisher": """
# Publisher HTTP API

The HTTP API of `outbox-publisher serve`: intake (orders and events), the backlog
figures, the probes, metrics, and the operator console's page and API. What the relay
sends to a sink, and what it does with each reply, is in
[the wire protocol](wire-protocol.md).
""",
    "sink": """
# Sink HTTP API

The HTTP API of `outbox-sink`: the inbox (one event or a batch, as CloudEvents), the
records it keeps, the inventory of the built-in warehouse, the probes and metrics.
How a sender uses it, and what each status means to the relay, is in
[the wire protocol](wire-protocol.md).
""",
}


def render(package: str) -> str:
    """The page of `package`'s document ("publisher" or "sink")."""
    return render_document(package, load_document(package))


def render_document(package: str, document: Json) -> str:
    """The page of an OpenAPI `document` served by `package`."""
    rendering = _Document(document)
    info = document.get("info", {})
    about = (
        f"This page is rendered from the OpenAPI {document.get('openapi', '')} document"
        f" shipped in the `{package}` package, which the running service serves at"
        f" {code('GET ' + OPENAPI_PATH)} (document version {code(info.get('version', ''))})."
        " Feed that document to a client generator or a contract-testing tool; read this"
        " page to find a route."
    )
    return page(
        GENERATED_NOTE,
        INTRO[package],
        about,
        text(info.get("description", "")),
        rendering.index(),
        rendering.security(),
        "## Operations",
        *rendering.operations(),
        "## Schemas",
        *rendering.schemas(),
    )


class _Document:
    def __init__(self, document: Json) -> None:
        self.document = document
        self.components: Json = document.get("components", {})

    # ------------------------------------------------------------------ lookups

    def resolve(self, item: Json) -> Json:
        """A parameter, response or header with its $ref followed."""
        while "$ref" in item:
            item = self._target(item["$ref"])
        return item

    def _target(self, ref: str) -> Json:
        node: Any = self.document
        for part in ref.removeprefix("#/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        if not isinstance(node, dict):
            raise ValueError(f"{ref} is not an object")
        return node

    def _operations(self) -> Iterator[tuple[str, str, Json, list[Json]]]:
        for path, item in self.document.get("paths", {}).items():
            shared = item.get("parameters", [])
            for method in item:
                if method in METHODS:
                    yield path, method, item[method], shared

    # ------------------------------------------------------------------ sections

    def index(self) -> str:
        rows = [
            [
                f"[{code(_title(path, method))}](#{slug(_title(path, method))})",
                text(op.get("summary", "")),
            ]
            for path, method, op, _ in self._operations()
        ]
        return "## Routes\n\n" + table(["Route", "Summary"], rows)

    def security(self) -> str:
        schemes = self.components.get("securitySchemes", {})
        if not schemes:
            return ""
        rows = []
        for name, scheme in schemes.items():
            kind = scheme.get("type", "")
            if kind == "http":
                kind = f"HTTP {scheme.get('scheme', '')}"
            elif kind == "apiKey":
                kind = f"{scheme.get('in', '')} {code(scheme.get('name', ''))}"
            rows.append([code(name), kind, text(scheme.get("description", ""))])
        return "## Security schemes\n\n" + table(["Scheme", "Kind", "Description"], rows)

    def operations(self) -> Iterator[str]:
        gets = {path: op for path, method, op, _ in self._operations() if method == "get"}
        for path, method, op, shared in self._operations():
            twin = gets.get(path)
            if (
                method == "head"
                and twin is not None
                and op["responses"].keys() == twin["responses"].keys()
            ):
                yield self._head(path, op)
            else:
                yield self._operation(path, method, op, shared)

    def _head(self, path: str, op: Json) -> str:
        statuses = ", ".join(code(status) for status in op["responses"])
        lines = [f"### {code(_title(path, 'head'))}", _sentence(op.get("summary", ""))]
        if op.get("description"):
            lines.append(text(op["description"]))
        lines.append(
            f"The same statuses as {code(_title(path, 'get'))} ({statuses}), headers only."
        )
        return "\n\n".join(lines)

    def _operation(self, path: str, method: str, op: Json, shared: list[Json]) -> str:
        parts = [f"### {code(_title(path, method))}", _sentence(op.get("summary", ""))]
        if op.get("description"):
            parts.append(text(op["description"]))
        if op.get("operationId"):
            parts.append(f"Operation ID: {code(op['operationId'])}.")
        if "security" in op:
            parts.append(self._op_security(op["security"]))
        parameters = [self.resolve(p) for p in [*shared, *op.get("parameters", [])]]
        if parameters:
            parts.append(self._parameters(parameters))
        if "requestBody" in op:
            parts.append(self._body(self.resolve(op["requestBody"])))
        parts.append(self._responses(op.get("responses", {})))
        return "\n\n".join(parts)

    def _op_security(self, requirements: list[Json]) -> str:
        names = [code(name) for req in requirements for name in req]
        if not names:
            return "Security: none."
        optional = any(not req for req in requirements)
        joined = " or ".join(names)
        if optional:
            return f"Security: {joined} when the service is configured with it, else none."
        return f"Security: {joined}."

    def _parameters(self, parameters: list[Json]) -> str:
        rows = [
            [
                code(p.get("name", "")),
                p.get("in", ""),
                "yes" if p.get("required") else "no",
                self.type_of(p.get("schema", {})),
                text(p.get("description", "")),
            ]
            for p in parameters
        ]
        return "**Parameters**\n\n" + table(
            ["Name", "In", "Required", "Schema", "Description"], rows
        )

    def _body(self, body: Json) -> str:
        rows = [
            [code(media), self.type_of(content.get("schema", {}))]
            for media, content in body.get("content", {}).items()
        ]
        required = "required" if body.get("required") else "optional"
        head = f"**Request body** ({required})"
        if body.get("description"):
            head += ": " + text(body["description"])
        return head + "\n\n" + table(["Content type", "Schema"], rows)

    def _responses(self, responses: Json) -> str:
        rows = []
        for status, raw in responses.items():
            response = self.resolve(raw)
            bodies = "<br>".join(
                f"{code(media)}: {self.type_of(content.get('schema', {}))}"
                if content.get("schema")
                else code(media)
                for media, content in response.get("content", {}).items()
            )
            headers = ", ".join(code(name) for name in response.get("headers", {}))
            rows.append([code(status), text(response.get("description", "")), bodies, headers])
        return "**Responses**\n\n" + table(["Status", "Description", "Body", "Headers"], rows)

    def schemas(self) -> Iterator[str]:
        for name, schema in self.components.get("schemas", {}).items():
            yield self._schema(name, schema)

    def _schema(self, name: str, schema: Json) -> str:
        parts = [f"### {name}"]
        if schema.get("description"):
            parts.append(text(schema["description"]))
        summary = self.type_of(schema)
        limits = self.constraints(schema)
        parts.append(f"Type: {summary}" + (f"; {limits}." if limits else "."))
        rows = list(self._properties(schema, ""))
        if rows:
            parts.append(
                table(["Property", "Type", "Required", "Constraints", "Description"], rows)
            )
        return "\n\n".join(parts)

    def _properties(self, schema: Json, prefix: str) -> Iterator[list[str]]:
        required = set(schema.get("required", []))
        for prop, sub in schema.get("properties", {}).items():
            if not isinstance(sub, dict):
                yield [code(prefix + prop), self.type_of(sub), "no", "", ""]
                continue
            yield [
                code(prefix + prop),
                self.type_of(sub),
                "yes" if prop in required else "no",
                self.constraints(sub),
                text(sub.get("description", "")),
            ]
            if "$ref" not in sub and "properties" in sub:
                yield from self._properties(sub, f"{prefix}{prop}.")
            items = sub.get("items")
            if isinstance(items, dict) and "$ref" not in items and "properties" in items:
                yield from self._properties(items, f"{prefix}{prop}[].")

    # ------------------------------------------------------------------ types

    def type_of(self, schema: Json) -> str:
        """A schema in a few words: references as links to their section."""
        if isinstance(schema, bool):  # JSON Schema's `true` (anything) and `false` (nothing)
            return "any" if schema else "nothing (not allowed)"
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            return f"[{name}](#{slug(name)})"
        for key, word in (("oneOf", "one of"), ("anyOf", "any of"), ("allOf", "all of")):
            if key in schema:
                choices = ", ".join(self.type_of(s) for s in schema[key])
                return f"{word}: {choices}"
        if "const" in schema:
            return f"{code(json.dumps(schema['const']))} (constant)"
        if "enum" in schema:
            return "one of " + ", ".join(code(json.dumps(v)) for v in schema["enum"])
        kind = schema.get("type")
        kinds = kind if isinstance(kind, list) else [kind] if kind else []
        words = []
        for one in kinds:
            if one == "array" and isinstance(schema.get("items"), dict):
                words.append(f"array of {self.type_of(schema['items'])}")
            else:
                words.append(str(one))
        return " or ".join(words) or "any"

    def constraints(self, schema: Json) -> str:
        if not isinstance(schema, dict):
            return ""
        found = []
        for key, label in _CONSTRAINTS:
            if key in schema:
                value = schema[key]
                shown = value if isinstance(value, str) and key != "default" else json.dumps(value)
                found.append(f"{label} {code(shown)}")
        if schema.get("additionalProperties") is False:
            found.append("no other properties")
        elif isinstance(schema.get("additionalProperties"), dict):
            found.append("other properties: " + self.type_of(schema["additionalProperties"]))
        return "; ".join(found)


def _title(path: str, method: str) -> str:
    return f"{method.upper()} {path}"


def _sentence(summary: str) -> str:
    return text(summary if summary.endswith((".", "?", "!")) or not summary else summary + ".")
