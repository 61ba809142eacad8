r"""Per-type JSON Schemas of event data: read once from a directory, checked at intake.

A schema directory holds one `TYPE.json` per event type, each a JSON Schema 2020-12 of
that type's `data`. `Schemas.load` reads every file, refuses any it cannot use with a
SchemaError that names the file, and builds two validators per type; `Schemas.check`
then validates an event's data without reading or building anything.

- Two validators, one verdict: jsonschema-rs (Rust, ~3 us for 1 KiB of data) decides
  whether the data is valid; only data it refuses goes to jsonschema (pure Python,
  ~500 us), whose errors carry the place and the rule reported. Where the two differ
  on I-JSON data (what intake lets through), jsonschema-rs's verdict stands:
  - `pattern` is an ECMA-262 regular expression, as 2020-12 has it: `$` is the end of
    the text (Python's `re` also matches before a final newline), `\d` and `\w` are
    ASCII. jsonschema matches `pattern`, `patternProperties` and
    `additionalProperties` with jsonschema-rs's engine too (linear time, where
    Python's `re` backtracks: `^(a+)+$` took minutes on thirty characters), so such
    data is refused at its place, by its rule. jsonschema's `unevaluatedProperties`
    would still match the names `patternProperties` covers with Python's `re`: a
    schema holding both is not given to jsonschema, and its failures are named at
    `/data` without a rule. A
    pattern that is not ECMA-262 (`\Z`, `a{,3}`) is a SchemaError at load.
  - `multipleOf` is decided on the numbers as decimals: 0.07 is a multiple of 0.01
    (jsonschema divides in binary floating point, gets 7.000000000000001, refuses it).
  A value jsonschema-rs cannot read (not JSON: a set, a key that is not a string, a
  lone surrogate) is left to jsonschema. Beyond I-JSON the two differ more: NaN and
  infinities, a tuple (an array to jsonschema-rs), and data nested tens of thousands
  deep, which overflows jsonschema-rs's stack (Python's json stops at its recursion
  limit, and intake at 32 levels, long before).

- Draft: 2020-12 only. `$schema` may be omitted or name 2020-12; another draft is
  refused rather than checked by rules its author did not write for.
- `$ref` and `$dynamicRef` must resolve inside their own file (`#/$defs/...`, an anchor,
  the file's `$id`). Nothing is ever fetched: the registry has no retrieve, and `load`
  resolves every reference once, so a remote one is a SchemaError there, never a
  network call or a surprise when an event is checked. jsonschema-rs, which would
  fetch over HTTP and from files by default, is built `offline` besides.
- `format` is an annotation, as 2020-12 has it by default: no format is asserted (by
  either validator), so `{"format": "email"}` accepts any string. Use `pattern` for a
  rule that must hold.
- A failure is reported as InvalidEvent(pointer, problem): the RFC 6901 pointer into
  the event (the data is under `/data`) and the rule, as the keyword that failed and
  the validator's message. Of several failures, the one jsonschema's `best_match`
  picks is named: the same one every time, and inside `anyOf`/`oneOf` the most
  precise one.
- strict: an event of a type without a schema is refused (`/type`); otherwise it
  passes unchecked.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast

import jsonschema_rs
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError as MetaSchemaError
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator
from referencing import Registry, Resource
from referencing.exceptions import NoSuchAnchor, PointerToNowhere, Unresolvable
from referencing.jsonschema import DRAFT202012

from shared.errors import InvalidEvent

if TYPE_CHECKING:
    # Not exported by `referencing` itself; its documentation names it from there.
    # Used as a type only, never imported at run time.
    from referencing._core import Resolver

SCHEMA_SUFFIX: Final = ".json"
DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"
PROBLEM_MAX_CHARS: Final = 200  # of the validator's message quoted in a problem
# A file's stem is an event type: the rule of an event's `type` (shared/event.py).
_TYPE_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
_TYPE_RULE: Final = "1-128 of A-Z a-z 0-9 . _ -"
# No retrieve: a URI that is not in a schema's own file is Unresolvable, never fetched.
_OFFLINE: Final[Registry[Any]] = Registry()
_REFERENCES: Final = ("$ref", "$dynamicRef")
_PROBES: Final[tuple[Any, ...]] = (None, True, 0, "", [], {})  # each JSON type

# A keyword's check, as jsonschema calls it: (validator, value, instance, schema).
_Keyword = Callable[[Any, Any, Any, Any], Iterator[ValidationError]]


class SchemaError(ValueError):
    """A schema directory or file that cannot be used."""


class Compiled(NamedTuple):
    """The two validators of one schema (module docstring): `fast` gives the verdict,
    `precise` the place and the rule of a failure; None where jsonschema would match
    names with Python's backtracking `re` (`unevaluatedProperties` beside
    `patternProperties`), and a failure is then named at `/data`."""

    fast: jsonschema_rs.Validator
    precise: Validator | None


class Schemas:
    """The schemas of event types, each compiled once; build with `load` or `none`."""

    __slots__ = ("_compiled", "_types", "strict")

    def __init__(self, compiled: Mapping[str, Compiled], *, strict: bool) -> None:
        self._compiled = dict(compiled)
        self._types = frozenset(self._compiled)
        self.strict = strict

    @property
    def types(self) -> frozenset[str]:
        """The event types that have a schema."""
        return self._types

    def __repr__(self) -> str:
        return f"Schemas(types={sorted(self.types)!r}, strict={self.strict!r})"

    @classmethod
    def load(cls, directory: str | Path, *, strict: bool = False) -> Schemas:
        """The schemas of `directory`: every file but hidden ones must be a `TYPE.json`
        with a usable 2020-12 schema, else SchemaError (so a typo such as
        `payment.captured.jsn` is noticed instead of leaving the type unchecked). An
        empty name is a SchemaError too, not the current directory."""
        if not str(directory):
            raise SchemaError("the schema directory is named by an empty path")
        folder = Path(directory)
        try:
            paths = sorted(folder.iterdir())
        except OSError as exc:
            raise SchemaError(
                f"{folder}: cannot read the schema directory: {_reason(exc)}"
            ) from exc
        return cls(
            {_event_type(path): _compile(path) for path in paths if not path.name.startswith(".")},
            strict=strict,
        )

    @classmethod
    def none(cls) -> Schemas:
        """No schemas, not strict: `check` passes every event."""
        return cls({}, strict=False)

    def check(self, event_type: str, data: object) -> None:
        """Return if `data` is valid for `event_type`, else raise InvalidEvent naming
        the failing place in the event and the rule."""
        compiled = self._compiled.get(event_type)
        if compiled is None:
            if self.strict:
                raise InvalidEvent("/type", f"has no schema (strict types): {event_type!r}")
            return
        try:
            if compiled.fast.is_valid(data):
                return
            refused = True
        except ValueError:  # not JSON (a set, a lone surrogate): jsonschema decides
            refused = False
        if compiled.precise is None:
            if refused:
                raise InvalidEvent("/data", f"does not match the schema of {event_type!r}")
            raise InvalidEvent("/data", f"is not JSON the schema of {event_type!r} can check")
        # Any value may be checked: one that is not JSON fails a `type` like any other.
        error: ValidationError | None = best_match(compiled.precise.iter_errors(cast(Any, data)))
        if error is not None:
            raise InvalidEvent(
                _json_pointer("/data", error.absolute_path),
                f"does not match the schema of {event_type!r}: {_rule(error)}",
            )
        if refused:
            # The validators differ (module docstring): jsonschema-rs's verdict stands,
            # without a place or a rule, which only jsonschema would have named.
            raise InvalidEvent("/data", f"does not match the schema of {event_type!r}")


def _json_pointer(base: str, tokens: Iterable[str | int]) -> str:
    """`base` followed by `tokens` as RFC 6901 reference tokens (`~` as `~0`, `/` as `~1`)."""
    return base + "".join(
        "/" + str(token).replace("~", "~0").replace("/", "~1") for token in tokens
    )


def _rule(error: ValidationError) -> str:
    """The keyword that failed and the validator's message, bounded."""
    # A `false` schema fails by itself, not by a keyword of it.
    keyword = "false" if error.schema is False else str(error.validator)
    return f"{keyword}: {_bounded(error.message)}"


def _bounded(text: str) -> str:
    if len(text) <= PROBLEM_MAX_CHARS:
        return text
    return text[: PROBLEM_MAX_CHARS - 3] + "..."


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


# ---------------------------------------------------------------------- loading


def _event_type(path: Path) -> str:
    """The event type that `path` is the schema of, else SchemaError."""
    if not path.name.endswith(SCHEMA_SUFFIX):
        raise SchemaError(f"{path}: not a schema file: schema files are named TYPE.json")
    stem = path.name.removesuffix(SCHEMA_SUFFIX)
    if _TYPE_RE.fullmatch(stem) is None:
        raise SchemaError(f"{path}: {stem!r} is not an event type ({_TYPE_RULE})")
    return stem


def _compile(path: Path) -> Compiled:
    """The validators of the schema in `path`, once the schema is found usable, else
    SchemaError."""
    try:
        return _usable(path)
    except RecursionError as exc:
        raise SchemaError(f"{path}: nested too deeply, or a $ref loops without end") from exc


def _usable(path: Path) -> Compiled:
    schema = _read(path)
    _check_draft(path, schema)
    try:
        Draft202012Validator.check_schema(schema)
    except MetaSchemaError as exc:
        where = _json_pointer("", exc.absolute_path) or "the top"
        raise SchemaError(
            f"{path}: not a valid JSON Schema 2020-12: at {where}: {exc.validator}:"
            f" {_bounded(exc.message)}"
        ) from exc
    _check_references(path, DRAFT202012.create_resource(schema))
    validator = _Validator(schema, registry=_OFFLINE)
    # A $ref that loops without reaching into the data (`{"$ref": "#"}`) would recurse
    # on every event: one value of each JSON type meets the loops that are taken
    # whatever the data. A loop behind a condition on the data is not found here.
    for probe in _PROBES:
        for _ in validator.iter_errors(probe):
            pass
    precise = None if _matches_names_by_re(schema) else validator
    return Compiled(_fast(path, schema), precise)


def _matches_names_by_re(schema: Any) -> bool:
    """Whether jsonschema would match property names with Python's `re`, which
    backtracks (`^(a+)+$` takes minutes on thirty characters): `unevaluatedProperties`
    finds the names `patternProperties` evaluated that way, beyond what the keywords
    of this module take over. Found anywhere in the schema, conservatively."""
    keywords: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            keywords.update(key for key in value if isinstance(key, str))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(schema)
    return {"unevaluatedProperties", "patternProperties"} <= keywords


def _fast(path: Path, schema: Any) -> jsonschema_rs.Validator:
    """jsonschema-rs's validator of a schema jsonschema found usable, else SchemaError
    (a `pattern` that is not ECMA-262)."""
    try:
        # offline: a remote reference is refused, never fetched (none is left by now).
        # Formats are annotations, as for jsonschema; said here in case the default moves.
        return jsonschema_rs.Draft202012Validator(schema, offline=True, validate_formats=False)
    except jsonschema_rs.ValidationError as exc:
        where = _json_pointer("", exc.instance_path) or "the top"
        raise SchemaError(
            f"{path}: not a valid JSON Schema 2020-12 (jsonschema-rs): at {where}:"
            f" {_bounded(exc.message)}"
        ) from exc
    except (jsonschema_rs.ReferencingError, ValueError) as exc:
        raise SchemaError(
            f"{path}: not a valid JSON Schema 2020-12 (jsonschema-rs): {_bounded(str(exc))}"
        ) from exc


def _read(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SchemaError(f"{path}: cannot be read: {_reason(exc)}") from exc
    try:
        return json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise SchemaError(f"{path}: not JSON: {exc}") from exc


def _check_draft(path: Path, schema: Any) -> None:
    if not isinstance(schema, dict) or "$schema" not in schema:
        return
    named = schema["$schema"]
    if not isinstance(named, str) or named.rstrip("#") != DRAFT_2020_12:
        raise SchemaError(
            f"{path}: $schema is {_bounded(repr(named))}: only 2020-12 is used ({DRAFT_2020_12})"
        )


def _check_references(path: Path, root: Resource[Any]) -> None:
    """Resolve every reference of the schema once, offline, so that none is left to
    fail, or to be fetched, when an event is checked."""
    for resolver, keyword, ref in _references(_OFFLINE.resolver_with_root(root), root):
        try:
            resolver.lookup(ref)
        except (PointerToNowhere, NoSuchAnchor) as exc:
            raise SchemaError(f"{path}: {keyword} {ref!r} points to nothing in the file") from exc
        except Unresolvable as exc:
            raise SchemaError(
                f"{path}: {keyword} {ref!r} is outside the file: references are resolved"
                " within their own file and never fetched"
            ) from exc


def _references(
    resolver: Resolver[Any], resource: Resource[Any]
) -> Iterator[tuple[Resolver[Any], str, str]]:
    """Each reference of `resource` and its subschemas, with the resolver of its place
    (an `$id` on the way changes the base a relative reference resolves against)."""
    contents = resource.contents
    if isinstance(contents, dict):
        for keyword in _REFERENCES:
            ref = contents.get(keyword)
            if isinstance(ref, str):
                yield resolver, keyword, ref
    for subresource in resource.subresources():
        yield from _references(resolver.in_subresource(subresource), subresource)


# ---------------------------------------------------------------------- the validator
# jsonschema (4.26) reports a `false` subschema met directly under `properties`,
# `patternProperties` or `prefixItems` without its place: {"properties": {"legacy":
# false}} fails {"legacy": 1} at the object, not at /legacy (its `descend` returns
# before adding the path). These three keywords are jsonschema's own, run with each
# `false` there read as `true`, plus the failure of each `false` at its place.


def _falses_of_properties(value: Any, instance: Any) -> Iterator[str]:
    return (name for name, schema in value.items() if schema is False and name in instance)


def _falses_of_pattern_properties(value: Any, instance: Any) -> Iterator[str]:
    for pattern, schema in value.items():
        if schema is False:
            yield from (name for name in instance if _matches(pattern, name))


# `pattern`, `patternProperties` and `additionalProperties` (beside
# `patternProperties`) match with jsonschema-rs's regular expressions,
# which take linear time: Python's `re` backtracks, so that a pattern such as
# ^(a+)+$ held a refused event's check (and the service's loop) for minutes on a
# string of thirty characters.


@functools.lru_cache(maxsize=1024)
def _pattern_validator(pattern: str) -> jsonschema_rs.Validator:
    return jsonschema_rs.Draft202012Validator({"pattern": pattern})


def _matches(pattern: str, text: str) -> bool:
    """Whether `pattern` finds a match in `text`, as re.search would say."""
    try:
        return bool(_pattern_validator(pattern).is_valid(text))
    except ValueError:  # a lone surrogate, which only Python's strings hold
        return re.search(pattern, text) is not None


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """jsonschema's `pattern`, matched by _matches."""
    if validator.is_type(instance, "string") and not _matches(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, value: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    """jsonschema's `patternProperties`, matched by _matches."""
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in value.items():
        for name, item in instance.items():
            if _matches(pattern, name):
                yield from validator.descend(item, subschema, path=name, schema_path=pattern)


def _falses_of_prefix_items(value: Any, instance: Any) -> Iterator[int]:
    return (index for index, schema in enumerate(value[: len(instance)]) if schema is False)


def _additional_properties(
    validator: Any, value: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    """jsonschema's `additionalProperties`, the names that `patternProperties` covers
    matched by _matches."""
    if not validator.is_type(instance, "object"):
        return
    properties, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = {
        name
        for name in instance
        if name not in properties and not any(_matches(pattern, name) for pattern in patterns)
    }
    if validator.is_type(value, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], value, path=extra)
    elif not value and extras:
        joined = ", ".join(repr(each) for each in sorted(extras))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            listed = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({joined} {verb} unexpected)"
            )


def _placing_false(
    keyword: str,
    falses: Callable[[Any, Any], Iterator[str] | Iterator[int]],
    container: str,
    own: _Keyword | None = None,
) -> _Keyword:
    """jsonschema's `keyword` (or `own`), with the failure of a `false` subschema at
    its place."""
    if own is None:
        own = Draft202012Validator.VALIDATORS[keyword]

    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if not any(item is False for item in _subschemas(value)):
            yield from own(validator, value, instance, schema)
            return
        yield from own(validator, _false_as_true(value), instance, schema)
        if validator.is_type(instance, container):
            for place in falses(value, instance):
                yield ValidationError(
                    f"False schema does not allow {instance[place]!r}",
                    path=[place],
                    instance=instance[place],
                    schema=False,
                )

    return check


def _subschemas(value: Any) -> Iterable[Any]:
    return value.values() if isinstance(value, dict) else value


def _false_as_true(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: True if schema is False else schema for key, schema in value.items()}
    return [True if schema is False else schema for schema in value]


# extend is jsonschema's way to change a keyword (its stubs leave it untyped).
_Validator: Final[type[Validator]] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {
        "properties": _placing_false("properties", _falses_of_properties, "object"),
        "patternProperties": _placing_false(
            "patternProperties", _falses_of_pattern_properties, "object", _pattern_properties
        ),
        "pattern": _pattern,
        "additionalProperties": _additional_properties,
        "prefixItems": _placing_false("prefixItems", _falses_of_prefix_items, "array"),
    },
)
