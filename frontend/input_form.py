"""The start form generated from a workflow version's input schema (issue 19).

``start_form(workflow, data)`` returns the form of a version's "Start a run" card: for a
version with an ``input_schema`` whose root lists ``properties``, a SchemaStartForm with one
field per property, server-rendered:

- ``string`` → a text input (``format`` date / email / uri → a date, email or url input;
  ``minLength`` / ``maxLength`` as attributes), ``number`` / ``integer`` → a number input
  (``minimum`` / ``maximum``), ``boolean`` → a checkbox (a Yes / No / unset select when it
  is optional and has no default, so "not given" stays expressible), ``enum`` (or
  ``const``) → a select;
- an object with ``properties`` → a fieldset of its own fields (at most MAX_FIELDSET_DEPTH
  levels), a local ``$ref`` followed;
- anything else (arrays, free-form objects, ``anyOf``, a list of types...) → a JSON
  textarea for that property.

Titles label the fields (else the property's name), descriptions are their help text,
required properties are marked, defaults are the initial values. A blank field is left
out of the input (so the schema's default applies, or its ``required`` names it), and so
is an optional fieldset in which nothing was filled in (a checkbox left as it was shown
does not count).

The form only turns the fields into a JSON object: the rules are the schema's, applied by
``engine.services.start_run``, whose violations ``add_violations`` puts next to the field
at their JSON pointer (a fieldset's own, or the form's for the whole input). Without a
schema, or one the form cannot lay out (a root with no ``properties``, more than
MAX_FORM_FIELDS fields), the form is the JSON textarea (StartRunForm), with the
violations listed under it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from django import forms

from engine import input_schema
from engine.models import Workflow
from frontend.forms_workflows import PriorityField, StartRunForm

# Nested objects laid out as fieldsets, and fields in one form; past either, the whole
# input is a JSON textarea.
MAX_FIELDSET_DEPTH = 4
MAX_FORM_FIELDS = 200
# A JSON number as RFC 8259 writes it (what a number field accepts).
_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?\Z")
_MISSING = object()  # a blank field: left out of the input
_STRING_INPUT_TYPES = {"date": "date", "email": "email", "uri": "url"}


@dataclasses.dataclass
class InputNode:
    """One property of the form: a field (``name`` is its form field) or a fieldset
    (``children``). ``pointer`` is its JSON pointer in the input."""

    pointer: str
    key: str
    label: str
    description: str
    required: bool
    name: str = ""
    kind: str = "field"  # field | fieldset
    children: list[InputNode] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)
    checkbox: bool = False
    bound: Any = None  # the BoundField, set once the form is built

    @property
    def is_fieldset(self) -> bool:
        return self.kind == "fieldset"


class JsonNumberField(forms.CharField):
    """A number input whose text must be a JSON number; cleans to int or float (blank: MISSING)."""

    def to_python(self, value: Any) -> Any:
        text = (value or "").strip()
        if not text:
            return _MISSING
        if not _JSON_NUMBER.match(text):
            raise forms.ValidationError("Enter a number, such as 42 or 0.5.")
        number = json.loads(text)
        if isinstance(number, float) and (number != number or number in (float("inf"), float("-inf"))):
            raise forms.ValidationError("Enter a finite number.")
        return number


class JsonValueField(forms.CharField):
    """A textarea holding any JSON value (blank: MISSING)."""

    def to_python(self, value: Any) -> Any:
        text = (value or "").strip()
        if not text:
            return _MISSING
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.") from None
        except RecursionError:
            raise forms.ValidationError("Nested too deeply.") from None


def _type_of(schema: dict[str, Any]) -> str | None:
    value = schema.get("type")
    return value if isinstance(value, str) else None


def _label(key: str, schema: dict[str, Any]) -> str:
    title = schema.get("title")
    return title.strip() if isinstance(title, str) and title.strip() else key


def _description(schema: dict[str, Any]) -> str:
    text = schema.get("description")
    return text if isinstance(text, str) else ""


def _number_attrs(schema: dict[str, Any], *, integer: bool) -> dict[str, Any]:
    attrs: dict[str, Any] = {"step": "1" if integer else "any", "inputmode": "numeric" if integer else "decimal"}
    for keyword, attr in (("minimum", "min"), ("maximum", "max")):
        value = schema.get(keyword)
        if isinstance(value, int | float) and not isinstance(value, bool):
            attrs[attr] = value
    return attrs


class SchemaStartForm(forms.Form):
    """The start form of a version with a layable input schema (module docstring).

    ``tree`` lists the InputNodes of the root's properties in the schema's order;
    ``input_value()`` (after ``is_valid()``) is the input they make; ``add_violations``
    shows a start's refusal next to the fields.
    """

    priority = PriorityField(help_text="-10 to 10: higher runs first within the organization's share.")

    def __init__(self, data=None, *, schema: input_schema.InputSchema, layout: list[InputNode]):
        super().__init__(data)
        self.schema = schema
        self.tree = layout
        self._nodes: list[InputNode] = []
        for node in _walk(self.tree):
            self._nodes.append(node)
            if not node.is_fieldset:
                self.fields[node.name] = node.bound  # the forms.Field, bound below
        for node in self._nodes:
            if not node.is_fieldset:
                node.bound = self[node.name]
        self.root_errors: list[str] = []

    def input_value(self) -> dict[str, Any]:
        """The run input of the cleaned fields (blank fields left out; an optional
        fieldset left out when all its fields are blank)."""
        return _collect(self.tree, self.cleaned_data)

    def add_violations(self, violations: list[input_schema.Violation]) -> None:
        """Put each violation on the node at its JSON pointer, or the closest enclosing one
        (a JSON field shows the rest of the pointer: ``/0/name: ...``); one on the whole
        input goes to the form's own errors."""
        by_pointer = {n.pointer: n for n in self._nodes}
        for v in violations:
            pointer, rest = v["path"], ""
            while pointer and pointer not in by_pointer:
                cut = pointer.rfind("/")
                rest = pointer[cut:] + rest
                pointer = pointer[:cut]
            message = f"{rest}: {v['message']}" if rest else v["message"]
            node = by_pointer.get(pointer)
            if node is None:
                self.add_error(None, f"{v['path'] + ': ' if v['path'] else ''}{v['message']}")
            elif node.is_fieldset:
                node.errors.append(message)
            else:
                self.add_error(node.name, message)

    @property
    def has_node_errors(self) -> bool:
        return any(n.errors for n in self._nodes)


def _walk(nodes: list[InputNode]):
    for node in nodes:
        yield node
        if node.is_fieldset:
            yield from _walk(node.children)


def _collect(nodes: list[InputNode], cleaned: dict[str, Any]) -> dict[str, Any]:
    return _collect_given(nodes, cleaned)[0]


def _collect_given(nodes: list[InputNode], cleaned: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the object these nodes make, whether anything in it was given). A checkbox left at
    its initial state does not count as given: it always sends a value, and an optional
    fieldset holding one must still be left out when nothing else in it was filled in."""
    out: dict[str, Any] = {}
    given = False
    for node in nodes:
        if node.is_fieldset:
            value, inner = _collect_given(node.children, cleaned)
            if inner or node.required:
                out[node.key] = value
                given = True
            continue
        value = cleaned.get(node.name, _MISSING)
        if value is _MISSING or value is None or value == "":
            continue
        out[node.key] = value
        given = given or not node.checkbox or value != bool(node.bound.initial)
    return out, given


class _Layout:
    """Builds the InputNodes (and their form fields) of a schema."""

    def __init__(self, schema: input_schema.InputSchema):
        self.schema = schema
        self.count = 0

    def properties(self, node_schema: dict[str, Any], *, pointer: str, prefix: str, depth: int,
                   required_chain: bool) -> list[InputNode] | None:
        properties = node_schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            return None
        required = node_schema.get("required") if isinstance(node_schema.get("required"), list) else []
        nodes = []
        for index, (key, raw) in enumerate(properties.items()):
            sub = self.schema.resolve(raw)
            if not isinstance(sub, dict):
                sub = {}
            node = InputNode(pointer=f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}", key=key,
                             label=_label(key, sub), description=_description(sub), required=key in required,
                             name=f"{prefix}-{index}")
            self.count += 1
            if self.count > MAX_FORM_FIELDS:
                return None
            html_required = node.required and required_chain
            children = None
            if depth + 1 < MAX_FIELDSET_DEPTH and _type_of(sub) in ("object", None) and "enum" not in sub:
                children = self.properties(sub, pointer=node.pointer, prefix=node.name, depth=depth + 1,
                                           required_chain=html_required)
                if children is None and self.count > MAX_FORM_FIELDS:
                    return None
            if children is not None:
                node.kind, node.children = "fieldset", children
            else:
                node.bound, node.checkbox = self.field(sub, required=html_required, optional=not node.required)
            nodes.append(node)
        return nodes

    def field(self, sub: dict[str, Any], *, required: bool, optional: bool) -> tuple[forms.Field, bool]:
        """(the form field of one property's schema, whether it is a checkbox)."""
        default = sub.get("default", _MISSING)
        attrs: dict[str, Any] = {"required": True} if required else {}
        kind = _type_of(sub)
        choices = sub.get("enum") if isinstance(sub.get("enum"), list) else ([sub["const"]] if "const" in sub else None)
        if choices is not None:
            options = [(json.dumps(c), c if isinstance(c, str) else json.dumps(c)) for c in choices]
            if optional or default is _MISSING:
                options = [("", "— choose —" if not optional else "—"), *options]
            return forms.TypedChoiceField(
                choices=options, required=False, coerce=json.loads, empty_value=_MISSING,
                initial=json.dumps(default) if default is not _MISSING else "",
                widget=forms.Select(attrs=attrs)), False
        if kind == "string":
            input_type = _STRING_INPUT_TYPES.get(sub.get("format"), "text")
            for keyword, attr in (("minLength", "minlength"), ("maxLength", "maxlength")):
                if isinstance(sub.get(keyword), int):
                    attrs[attr] = sub[keyword]
            initial = default if isinstance(default, str) else ""
            return forms.CharField(required=False, strip=False, initial=initial,
                                   widget=forms.TextInput(attrs={**attrs, "type": input_type})), False
        if kind in ("number", "integer"):
            initial = json.dumps(default) if isinstance(default, int | float) and not isinstance(default, bool) else ""
            return JsonNumberField(required=False, initial=initial, widget=forms.NumberInput(
                attrs={**attrs, **_number_attrs(sub, integer=kind == "integer")})), False
        if kind == "boolean":
            if optional and default is _MISSING:
                return forms.NullBooleanField(required=False, widget=forms.Select(
                    attrs=attrs, choices=[("unknown", "—"), ("true", "Yes"), ("false", "No")])), False
            # A checkbox is never "required" in HTML (that would force it on): its value is always sent.
            return forms.BooleanField(required=False, initial=default is True), True
        return JsonValueField(
            required=False, initial=json.dumps(default, indent=2) if default is not _MISSING else "",
            widget=forms.Textarea(attrs={**attrs, "rows": 3, "spellcheck": "false", "class": "mono",
                                         "autocomplete": "off",
                                         "placeholder": "[ ]" if kind == "array" else "JSON"})), False


def layout(workflow: Workflow) -> tuple[input_schema.InputSchema, list[InputNode]] | None:
    """(the version's compiled schema, its form's nodes), or None when the version has no
    input schema or the form cannot lay it out (module docstring)."""
    if not workflow.input_schema_json:
        return None
    schema = input_schema.compiled(workflow.input_schema_json, organization_id=workflow.organization_id)
    built = _Layout(schema)
    root = schema.resolve(schema.schema)
    nodes = built.properties(root, pointer="", prefix="in", depth=0, required_chain=True) \
        if isinstance(root, dict) else None
    return (schema, nodes) if nodes else None


def start_form(workflow: Workflow, data=None) -> forms.Form:
    """The start form of ``workflow`` (bound to ``data`` when given): a SchemaStartForm
    when its input schema can be laid out, else the JSON textarea form."""
    laid = layout(workflow)
    if laid is None:
        form = StartRunForm(data)
        form.schema_text = workflow.input_schema_json  # shown beside the textarea, when there is one
        return form
    schema, nodes = laid
    return SchemaStartForm(data, schema=schema, layout=nodes)


def input_of(form: forms.Form) -> dict[str, Any]:
    """The run input a valid start form holds."""
    if isinstance(form, SchemaStartForm):
        return form.input_value()
    return form.cleaned_data["input"]


def add_violations(form: forms.Form, violations: list[input_schema.Violation]) -> None:
    """Show a start's input violations on ``form`` (see SchemaStartForm.add_violations;
    the JSON textarea form lists them under its field)."""
    if isinstance(form, SchemaStartForm):
        form.add_violations(violations)
        return
    for v in violations:
        form.add_error("input", f"{v['path'] or '(input)'}: {v['message']}")


__all__ = ["SchemaStartForm", "add_violations", "input_of", "layout", "start_form"]
