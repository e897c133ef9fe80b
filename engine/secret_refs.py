"""References to the organization's secrets in task configs (issue 18), and redaction.

A task config (any type's) holds a reference as ``{{ secrets.NAME }}`` (spaces inside the
braces optional) anywhere inside a JSON string: an http task's ``url``, a header value,
a string in its ``json`` body; a python task's ``params``; a worker task's ``input``. A
string may hold several references and other text (``"Bearer {{ secrets.TOKEN }}"``).
NAME is a secret name (tenancy.vault: 1-64 letters, digits or '_', not starting with a
digit).

The life of a reference:

- **definition time** (engine.definitions, engine.services): ``find_references`` lists the
  references of a config with the field path of each
  (``tasks[fetch].config.headers.Authorization``) and refuses a malformed one
  (``{{ secrets.bad-name }}``, ``{{ secret.X }}``, ``{{ secrets. }}``, an unclosed
  ``{{ secrets.X``) naming that path; ``check_references`` refuses names the organization
  has no secret of. The definition stores the reference, never a value.
- **attempt start** (engine.worker.execute, and the worker-queue path): ``resolve``
  returns a copy of the config with every reference replaced by the secret's current
  value, and the values it used. A secret deleted since the definition was applied fails
  the attempt for good (``SecretUnavailable``, a PermanentTaskError).
- **whatever the attempt leaves behind** (output, error, events, log lines): ``redact``
  replaces every occurrence of those values, in any string, by ``[redacted]`` before it is
  recorded, so no value reaches the database or a log (log lines: ``redaction_pattern``
  with ``flowforge.logs.redacting``). A handler that cuts a text short redacts it first
  and ``redact_tail``s the cut (the values are ``TaskContext.secret_values``): a cut
  through a value would otherwise leave its first characters.

Redaction covers a value of up to ANY_ENCODING_MAX_CHARS characters in any mix, character
by character, of percent-encoded UTF-8 (hex digits of either case), ``+`` for a space and
JSON's escapes (``\\/``, ``\\u00e9`` or ``\\u00E9``, surrogate pairs): what workers in other
languages echo. Every value is also covered as it is, percent-encoded as in a URL (every reserved
character, ``+`` for spaces, ``/`` left alone as ``urllib.parse.quote`` does by default,
and as httpx encodes a query or a path), and each of those as
it appears inside JSON text (escaped quotes, backslashes, non-ASCII): ``value_forms``. A
value a task or a remote server transforms otherwise (base64, hashed, cut in parts, one
character at a time) is not recognized, but each line of a multi-line value (a PEM key, a
JSON credential) of at least MIN_LINE_CHARS characters is redacted on its own
(``with_lines``): captured output is redacted line by line; tenancy.vault refuses values shorter than 4
characters, whose redaction would blank those characters everywhere (``redact`` still
redacts any non-empty value it is given).

Layer: beside ``handlers`` (which use ``has_reference`` and ``with_placeholders`` to
check configs that hold references); below ``definitions``, ``services`` and ``worker``.
http.py imports this module as a module (``from engine import secret_refs``), so
importing either first works.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, quote_plus

from engine.handlers.base import PermanentTaskError
from flowforge.crypto import DecryptionError
from tenancy import vault

# A well-formed reference; group 1 is the name (tenancy.vault.NAME_RE's pattern).
REFERENCE_RE = re.compile(r"\{\{\s*secrets\.([A-Za-z_][A-Za-z0-9_]{0,63})\s*\}\}")
# Where an attempt at a reference starts: "{{", optional spaces, "secret" or "secrets" (any
# case) as a whole word. Each such place must be a well-formed reference. Other "{{ ... }}"
# text (a template the remote side fills) is left alone.
_ATTEMPT_RE = re.compile(r"\{\{\s*secrets?(?![A-Za-z0-9_])", re.IGNORECASE)
REFERENCE_FORM = "{{ secrets.NAME }} with NAME 1-64 letters, digits or '_', not starting with a digit"
REDACTED = "[redacted]"
# What with_placeholders puts where a reference stands: a value every checked field accepts.
PLACEHOLDER = "secret"
# Characters of a malformed reference quoted in its error message.
_SHOWN_CHARS = 40


class SecretReferenceError(ValueError):
    """A config holds malformed secret references. ``errors`` is a list of
    {"path", "message"}, one per malformed reference, each naming its field path."""

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{e['path']}: {e['message']}" for e in errors))


class SecretUnavailable(PermanentTaskError):
    """An attempt cannot start because a secret its config references is gone (deleted
    since the definition was applied), cannot be decrypted with the deployment's keys,
    or is referenced malformed. A PermanentTaskError: another attempt would fail alike,
    so the task fails at once. The message names the secret and the field, never a value."""


# --- parsing -------------------------------------------------------------------------------------


def _malformed(text: str, start: int) -> str:
    """Why the attempt at a reference at ``text[start:]`` is not a well-formed one."""
    shown = text[start:start + _SHOWN_CHARS] + ("…" if len(text) - start > _SHOWN_CHARS else "")
    close = text.find("}}", start)
    inner = text[start + 2:close].strip() if close != -1 else text[start + 2:].strip()
    if close == -1:
        why = "it is not closed with }}"
    elif not inner.startswith("secrets"):
        why = "write secrets (plural, lower case): {{ secrets.NAME }}"
    elif not inner.startswith("secrets."):
        why = "a dot goes between secrets and the name: {{ secrets.NAME }}"
    elif not inner[len("secrets."):]:
        why = "the name is missing"
    else:
        why = f"{inner[len('secrets.'):]!r} is not a secret name"
    return f"malformed secret reference {shown!r}: {why}; write {REFERENCE_FORM}"


# Where a value sits, kept as a chain (parent, key or index) and spelled out only for a
# value that holds a reference: most values hold none, and building every path would cost
# more than the walk.
_Where = str | tuple[Any, str | int]


def _spelled(where: _Where) -> str:
    """``where`` written out: ``root.key[0].other``."""
    parts: list[str] = []
    while not isinstance(where, str):
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return where + "".join(reversed(parts))


def _names_in(text: str, where: _Where, refs: list[tuple[str, str]], errors: list[dict[str, str]]) -> None:
    """Append (path, name) of each reference in ``text`` to ``refs``, and an error naming
    the path for each malformed attempt at one."""
    for attempt in _ATTEMPT_RE.finditer(text):
        match = REFERENCE_RE.match(text, attempt.start())
        if match is None:
            errors.append({"path": _spelled(where), "message": _malformed(text, attempt.start())})
        else:
            refs.append((_spelled(where), match.group(1)))


def find_references(obj: Any, path: str, *, errors: list[dict[str, str]] | None = None) -> list[tuple[str, str]]:
    """Every secret reference inside ``obj`` (any JSON value: dict, list, str, number,
    bool, None), as [(field path, secret name), ...] in document order; a name referenced
    twice is listed twice. ``path`` names ``obj`` itself: ``tasks[fetch].config`` gives
    ``tasks[fetch].config.headers.Authorization`` and ``tasks[fetch].config.json.items[0]``.

    A malformed reference (``{{ secrets.bad-name }}``, ``{{ secret.X }}``,
    ``{{ secrets. }}``, an unclosed ``{{ secrets.X``) — and a reference in an object's key,
    where none is resolved — is an error naming its field path: appended to ``errors``
    when a list is given (and left out of the result), else raised together as
    SecretReferenceError once the whole of ``obj`` was read. Linear in the size of ``obj``;
    no recursion (a deep document cannot exhaust the stack).
    """
    refs: list[tuple[str, str]] = []
    problems: list[dict[str, str]] = [] if errors is None else errors
    stack: list[tuple[Any, _Where]] = [(obj, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if "{{" in value:  # the common case, no braces, is one scan of the string in C
                _names_in(value, where, refs, problems)
        elif isinstance(value, dict):
            for key in value:
                if isinstance(key, str) and "{{" in key and _ATTEMPT_RE.search(key):
                    problems.append({"path": _spelled((where, key)), "message": "a secret reference is resolved "
                                     "in values only, not in an object's keys"})
            # Pushed in reverse, so they are read (and reported) in document order.
            for key, item in reversed(list(value.items())):
                stack.append((item, (where, str(key))))
        elif isinstance(value, list):
            for index in range(len(value) - 1, -1, -1):
                stack.append((value[index], (where, index)))
    if errors is None and problems:
        raise SecretReferenceError(problems)
    return refs


def has_reference(text: str) -> bool:
    """True when ``text`` holds at least one well-formed reference."""
    return "{{" in text and REFERENCE_RE.search(text) is not None


def mentions_reference(text: str) -> bool:
    """True when ``text`` holds something written as a reference, well-formed or not
    (``find_references`` reports the malformed ones)."""
    return "{{" in text and _ATTEMPT_RE.search(text) is not None


def with_placeholders(text: str) -> str:
    """``text`` with each well-formed reference replaced by PLACEHOLDER (``secret``): what
    a config check parses where the value is not known yet (a URL that references one)."""
    return REFERENCE_RE.sub(PLACEHOLDER, text) if "{{" in text else text


def definition_references(document: dict[str, Any]) -> list[tuple[str, str]]:
    """The references of every task config of a normalized definition (what
    ``engine.definitions.validate_document`` returns: malformed ones were refused there),
    as [(``tasks[<key>].config.<path>``, name), ...]."""
    refs: list[tuple[str, str]] = []
    for task in document.get("tasks") or []:
        refs += find_references(task.get("config") or {}, f"tasks[{task['key']}].config", errors=[])
    return refs


def check_references(organization_id: Any, references: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    """The problems of ``references`` ([(path, name), ...], as ``find_references`` gives
    them) for the organization: one {"path", "message"} for each reference to a name it
    has no secret of, naming the path and the name; [] when all exist. One query (none
    without references). Writes nothing."""
    references = list(references)
    known = vault.existing_names(organization_id, {name for _path, name in references})
    return [
        {"path": path, "message": f"unknown secret {name!r}: the organization has no secret of that name; "
                                  f"set it first (PUT /api/v1/secrets/{name}/ or the Secrets page)"}
        for path, name in references if name not in known
    ]


# --- resolution ----------------------------------------------------------------------------------


def _map_leaves(obj: Any, leaf: Callable[[Any], Any], *, keys: bool) -> Any:
    """A copy of the JSON value ``obj`` (dicts, lists and tuples copied; tuples become
    lists) with ``leaf`` applied to every other value, and to every string key when
    ``keys``. No recursion: a deeply nested output cannot exhaust the stack."""
    if not isinstance(obj, dict | list | tuple):
        return leaf(obj)
    root: Any = {} if isinstance(obj, dict) else []
    stack = [(obj, root)]
    while stack:
        source, target = stack.pop()
        for key, value in (source.items() if isinstance(source, dict) else enumerate(source)):
            if isinstance(value, dict | list | tuple):
                new: Any = {} if isinstance(value, dict) else []
                stack.append((value, new))  # filled later, already in its place
            else:
                new = leaf(value)
            if isinstance(target, dict):
                target[leaf(key) if keys and isinstance(key, str) else key] = new
            else:
                target.append(new)
    return root


def _substitute(obj: Any, values: dict[str, str]) -> Any:
    """A copy of ``obj`` with each reference in its strings replaced by its value."""
    def leaf(value: Any) -> Any:
        if isinstance(value, str) and "{{" in value:
            return REFERENCE_RE.sub(lambda m: values[m.group(1)], value)
        return value

    return _map_leaves(obj, leaf, keys=False)


def resolve(organization_id: Any, obj: Any) -> tuple[Any, list[str]]:
    """``(copy, values)``: a copy of ``obj`` (a task config, or any JSON value) with every
    ``{{ secrets.NAME }}`` replaced by the current value of the organization's secret NAME,
    and the values used (each once, in the order first referenced) for ``redact``.

    Without references: ``obj`` itself (nothing to replace) and [], and no query; else
    one query. Either way ``obj`` is not modified, and callers must not modify what they get.
    Raises SecretUnavailable (a PermanentTaskError) when a referenced secret no longer
    exists ("secret NAME no longer exists"), cannot be decrypted, or a reference is
    malformed (a config stored before references were checked); the message names the
    secret and the field, never a value.
    """
    try:
        # In C, about three times faster than the walk: most configs hold no "{{" at all.
        if "{{" not in json.dumps(obj):
            return obj, []
    except (TypeError, ValueError):
        pass  # not JSON text as a whole: the walk decides
    try:
        refs = find_references(obj, "config")
    except SecretReferenceError as exc:
        raise SecretUnavailable(str(exc)) from None
    if not refs:
        return obj, []
    names = list(dict.fromkeys(name for _path, name in refs))
    try:
        values = vault.decrypt_values(organization_id, names)
    except DecryptionError as exc:
        raise SecretUnavailable(f"{exc}: the deployment's FLOWFORGE_SECRET_KEYS lack the key it was stored "
                                "under; ask the operator") from None
    for path, name in refs:
        if name not in values:
            raise SecretUnavailable(f"secret {name} no longer exists (referenced at {path}); set it again, or "
                                    "apply a version that does not reference it")
    return _substitute(obj, values), [values[name] for name in names]


def current_values(organization_id: Any, obj: Any) -> list[str]:
    """The current values of the secrets ``obj`` references that still exist and decrypt
    (each once, in the order first referenced): what ``redact`` should also be given for
    what an attempt left behind when the values it was handed are not known. Never raises
    for a secret that is gone or a malformed reference (those are left out): a missing
    secret must not switch the redaction of the others off. At most one query per name
    when some value does not decrypt, else one."""
    refs = find_references(obj, "config", errors=[])
    names = list(dict.fromkeys(name for _path, name in refs))
    if not names:
        return []
    try:
        values = vault.decrypt_values(organization_id, names)
    except DecryptionError:
        values = {}
        for name in names:
            try:
                values.update(vault.decrypt_values(organization_id, [name]))
            except DecryptionError:
                continue
    return [values[name] for name in names if name in values]


# --- redaction -----------------------------------------------------------------------------------


# What the WHATWG URL standard (and so httpx, building a task's URL) leaves unencoded in a
# query and in a path: printable ASCII but for the characters listed.
_URL_QUERY_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"#<>')
_URL_PATH_SAFE = "".join(c for c in _URL_QUERY_SAFE if c not in "?`{}")


def value_forms(value: str) -> set[str]:
    """The spellings of ``value`` that ``redact`` replaces: as it is, percent-encoded as a
    URL component (every reserved character, ``+`` for spaces, and as httpx encodes a
    query and a path), and each of those as it appears inside JSON text (escaped, with and
    without ``\\uXXXX``). Empty for an empty value."""
    if not value:
        return set()
    # quote(value) keeps its default safe "/": what a Python worker most often writes.
    bases = {value, quote(value, safe=""), quote(value), quote_plus(value, safe=""),
             quote(value, safe=_URL_QUERY_SAFE), quote(value, safe=_URL_PATH_SAFE)}
    forms = set(bases)
    for base in bases:
        forms.add(json.dumps(base)[1:-1])
        forms.add(json.dumps(base, ensure_ascii=False)[1:-1])
    forms.discard("")
    return forms


#: Values up to this many characters are matched character by character in any of their
#: encodings (``_any_encoding``); longer ones (certificates, keys) by ``value_forms`` only,
#: which keeps their pattern small.
ANY_ENCODING_MAX_CHARS = 1024


def _hex(byte: int, width: int = 2) -> str:
    """A pattern for ``byte`` in hex digits of either case: 0x2f gives ``2[fF]``."""
    return "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in f"{byte:0{width}x}")


def _any_encoding(value: str) -> str:
    """A pattern matching ``value`` with each character as itself or in any encoding a
    worker in another language may echo it in: percent-encoded UTF-8 with hex digits of
    either case (``%2f``, ``%2F``, also characters that need none, ``%70``), ``+`` for a
    space, JSON's escapes (``\\"``, ``\\/``, ``\\n``, ``\\u00e9`` or ``\\u00E9``, surrogate
    pairs), mixed freely within one value."""
    parts = []
    for char in value:
        options = {re.escape(char), re.escape(json.dumps(char)[1:-1])}
        options.add("%".join([""] + [_hex(b) for b in char.encode()]))
        code = ord(char)
        if code > 0xFFFF:
            high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
            options.add(r"\\u" + _hex(high, 4) + r"\\u" + _hex(low, 4))
        else:
            options.add(r"\\u" + _hex(code, 4))
        if char == " ":
            options.add(r"\+")
        elif char == "/":
            options.add(r"\\/")
        parts.append("(?:" + "|".join(sorted(options, key=len, reverse=True)) + ")")
    return "".join(parts)


#: A line of a multi-line value is redacted on its own when it has at least this many
#: characters once the spaces around it are stripped (the minimum length of a secret value,
#: tenancy.vault): a captured log is split into lines before it is redacted, and a value
#: printed line by line never appears whole. Shorter lines ("", "}", "-->") are no secret
#: on their own and would blank that text everywhere.
MIN_LINE_CHARS = vault.MIN_VALUE_CHARS
#: Lines never redacted on their own (JSON's literals, as tenancy.vault refuses them as
#: values), with or without a trailing comma.
_COMMON_LINES = frozenset({"true", "false", "null", "none", "undefined"})


def with_lines(values: Iterable[str]) -> tuple[str, ...]:
    """``values`` (each once, in order) followed by every line of each multi-line value
    (split at \n, \r\n or \r), stripped of the spaces around it, that has at least
    MIN_LINE_CHARS characters (but JSON's literals): what redaction replaces, so that no line of a PEM key or a
    JSON credential survives a text split into lines."""
    out = dict.fromkeys(v for v in values if isinstance(v, str) and v)
    for value in list(out):
        if "\n" in value or "\r" in value:
            for line in value.splitlines():
                line = line.strip()
                if len(line) >= MIN_LINE_CHARS and line.lower().rstrip(",") not in _COMMON_LINES:
                    out.setdefault(line)
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _pattern(values: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern matching every form of every value and of every line of a multi-line
    value (``with_lines``), longest first (so a value that contains another, a whole value
    its lines, is replaced whole), or None for no non-empty value."""
    alternatives = []
    for value in sorted(with_lines(values), key=len, reverse=True):
        if len(value) <= ANY_ENCODING_MAX_CHARS:
            alternatives.append(_any_encoding(value))
        alternatives += [re.escape(form) for form in sorted(value_forms(value), key=len, reverse=True)]
    if not alternatives:
        return None
    return re.compile("|".join(alternatives))


@functools.lru_cache(maxsize=256)
def _forms(values: tuple[str, ...]) -> tuple[str, ...]:
    values = with_lines(values)
    return tuple(sorted(set().union(*(value_forms(v) for v in values)), key=len, reverse=True)) if values else ()


def redact_tail(text: str, values: Iterable[str]) -> str:
    """``text`` that was cut short, with what a cut through a value left at its end — the
    longest end of ``text`` that begins a value (in any of its forms) — replaced by
    ``[redacted]``. Whole values are ``redact``'s; call both on a cut text."""
    forms = _forms(tuple(dict.fromkeys(v for v in values if isinstance(v, str) and v)))
    # A cut through a character's UTF-8 bytes decodes to U+FFFD: the value ends before it.
    core = text.rstrip("\ufffd")
    longest = 0
    for form in forms:
        i = core.find(form[0], max(0, len(core) - len(form)))
        while i != -1 and len(core) - i > longest:
            if form.startswith(core[i:]):
                longest = len(core) - i
                break
            i = core.find(form[0], i + 1)
    return core[:len(core) - longest] + REDACTED if longest else text


def redaction_pattern(values: Iterable[str]) -> re.Pattern[str] | None:
    """The compiled pattern ``redact`` uses for ``values`` (None when none is non-empty):
    for callers that redact many texts with the same values (a log filter)."""
    return _pattern(tuple(dict.fromkeys(v for v in values if isinstance(v, str) and v)))


def redact_text(text: str, pattern: re.Pattern[str] | None) -> str:
    """``text`` with every match of ``pattern`` (``redaction_pattern``) replaced by [redacted]."""
    if pattern is None or not text:
        return text
    return pattern.sub(REDACTED, text)


def redact(obj: Any, values: Iterable[str]) -> Any:
    """A copy of ``obj`` with every occurrence of any of ``values`` (non-empty strings;
    see the module docstring for the forms recognized) replaced by ``[redacted]``.

    ``obj`` is any JSON value — dict (keys too), list, str, number, bool, None — or a
    plain string (an error message, a log line). A number whose JSON text holds a value
    becomes the string ``[redacted]``. Without values, ``obj`` itself is returned.
    """
    pattern = redaction_pattern(values)
    if pattern is None:
        return obj
    return _redact(obj, pattern)


def _redact(obj: Any, pattern: re.Pattern[str]) -> Any:
    def leaf(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(REDACTED, value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return REDACTED if pattern.search(json.dumps(value)) else value
        return value

    return _map_leaves(obj, leaf, keys=True)
