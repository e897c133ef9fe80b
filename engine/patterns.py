"""Regular expressions written by members (input schemas' ``pattern`` and
``patternProperties``) or supplied by run data (a CEL condition's ``matches``), compiled
by RE2 at a bounded cost.

RE2 matches in time linear in the text, but *compiling* is not cheap for every pattern:
RE2 expands a counted repeat ``x{n,m}`` into ``m`` copies of ``x`` (and merges adjacent
repeats of the same atom into one longer run), and on this library's build compiling
``"a{0,1000}" * 20`` took a second and ``* 200`` minutes, with the GIL held: every other
thread of the process (a worker's other tasks, a web process's /healthz) waited. Two
fences, for every pattern whatever its source:

- **A budget of copies** (MAX_REPEAT_COPIES), checked by ``repeat_copies`` on the
  pattern's text before RE2 sees it: the copies that counted repeats add, nested repeats
  multiplying (``(ab){3}`` adds 4 atoms, ``(a{10}){10}`` 99). An ordinary pattern
  (``^\\d{4}-\\d{2}-\\d{2}$``, ``[a-z]{2,63}``) adds a few hundred at most.
- **A memory cap** (RE2_MAX_MEM_BYTES, RE2's ``max_mem``): a pattern whose program would
  be larger (a Unicode class such as ``\\pL`` compiles to about a thousand instructions,
  so ``\\pL{1,100}`` is refused) fails to compile at once with ``pattern too large``.

Measured on the development machine: within both fences a compile took at most a few
hundredths of a second (``"a{0,1000}" * 2``, the worst shape the copies budget admits,
about 0.03 s); over them the refusal takes microseconds (the copies: bench/bench_patterns.py,
0.2 ms for ``* 200``) or milliseconds (the memory cap).

A third fence is on *searching*: RE2 is linear in the text, but with a factor of the
program's size once its lazy DFA gives up (``a{0,1000}b`` over 500,000 characters took
30 s). ``search_cost`` (characters × instructions) is what a search may cost at worst;
``search`` refuses one over MAX_SEARCH_COST before running it, and input schemas charge
every search's cost to their validation budget.

Compiled patterns are kept per pattern text in a process-wide LRU (COMPILED_CACHE_SIZE),
so a start or a condition does not compile a definition's pattern again (google-re2's own
cache holds 128 patterns of any options; this one is explicit and holds only bounded ones). The key is the
text alone: a compiled pattern is a pure function of it, and a cache hit saves at most
milliseconds (the fences above), too little to tell one organization another's patterns.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator

import re2

#: Copies of atoms that counted repeats may add to one pattern, all together (RE2 refuses
#: on its own a single count above 1000).
MAX_REPEAT_COPIES = 2000
#: RE2's ``max_mem`` for one compiled pattern, in bytes: about 2/3 for the program (8 bytes
#: an instruction, so ~87,000 instructions), the rest for the lazy DFA's cache (a search that
#: fills it falls back to the NFA, still linear).
RE2_MAX_MEM_BYTES = 1 << 20
#: Compiled patterns kept per process (each at most RE2_MAX_MEM_BYTES, usually kilobytes).
COMPILED_CACHE_SIZE = 128
#: Instructions of compiled program all the distinct patterns of one definition may hold
#: together (``definition_budget``): each pattern is bounded, but a 64 KiB input schema or
#: 20,000 characters of conditions can hold thousands of them (``\pL{1,30}`` is 36,000
#: instructions and 0.04 s to compile). About 0.2 s of compiling and 2 MiB of programs.
MAX_DEFINITION_INSTRUCTIONS = 250_000
#: What a pattern refused for its size is charged: the most instructions RE2_MAX_MEM_BYTES
#: lets a program have (2/3 of it, 8 bytes each), since RE2 compiled that far.
_REFUSED_CHARGE = RE2_MAX_MEM_BYTES * 2 // 3 // 8

_OPTIONS = re2.Options()
_OPTIONS.max_mem = RE2_MAX_MEM_BYTES
_OPTIONS.log_errors = False  # a refused pattern is reported to the member, not to stderr
_OPTIONS.never_capture = True  # only "does it match" is asked; groups cost nothing then


#: Work one search may do at worst: characters of text × instructions of the program.
#: Measured here: 500,000 characters × about 1,000 instructions (``a{0,1000}b``) took 30 s,
#: some 60 ns a unit, so 5,000,000 units are at most about 0.3 s.
MAX_SEARCH_COST = 5_000_000


class PatternRefused(ValueError):
    """A pattern that FlowForge will not run: ``str(exc)`` says why (over the copies
    budget, too large a program, or a syntax RE2 does not accept)."""


def repeat_copies(pattern: str) -> int:
    """The copies of atoms that the counted repeats of ``pattern`` add once RE2 expands
    them: ``x{n}`` and ``x{n,}`` add (n - 1) * size(x), ``x{n,m}`` (m - 1) * size(x), where
    size counts the atoms (a literal, an escape, a class, ``.``) of ``x`` with its own
    repeats expanded. Alternatives add up (RE2 compiles each). Linear in the text; never
    raises (a malformed pattern is counted as far as it goes and RE2 refuses it after)."""
    # One frame per open group: [expanded size of closed alternatives, expanded size of the
    # current alternative, plain (unexpanded) size of both, size of the last item, plain
    # size of the last item]. The difference of expanded and plain sizes is the answer.
    stack: list[list[int]] = [[0, 0, 0, 0, 0, 0]]  # closed_e, cur_e, closed_p, cur_p, last_e, last_p
    i, n = 0, len(pattern)

    def atom(e: int, p: int) -> None:
        frame = stack[-1]
        frame[1] += e
        frame[3] += p
        frame[4], frame[5] = e, p

    while i < n:
        c = pattern[i]
        if c == "\\":
            if pattern.startswith("\\Q", i):  # literal text up to \E
                end = pattern.find("\\E", i + 2)
                end = n if end < 0 else end
                for _ in range(max(1, end - i - 2)):
                    atom(1, 1)
                i = end + 2
                continue
            if i + 1 < n and pattern[i + 1] in "pPx" and i + 2 < n and pattern[i + 2] == "{":
                close = pattern.find("}", i + 3)
                i = n if close < 0 else close + 1
            else:
                i += 2 if pattern[i + 1:i + 2] not in ("p", "P") else 3
            atom(1, 1)
            continue
        if c == "[":
            i = _class_end(pattern, i)
            atom(1, 1)
            continue
        if c == "(":
            if i + 1 < n and pattern[i + 1] == "?":
                # (?i) sets flags and is no group; (?i:...), (?:...), (?P<n>...) open one.
                j = i + 2
                while j < n and pattern[j] not in ":)<'":
                    j += 1
                if j < n and pattern[j] == ")":
                    i = j + 1
                    continue
                if j < n and pattern[j] in "<'":  # a name: (?P<name>...), (?<name>...)
                    close = pattern.find(">" if pattern[j] == "<" else "'", j + 1)
                    j = n - 1 if close < 0 else close
                stack.append([0, 0, 0, 0, 0, 0])
                i = j + 1
                continue
            stack.append([0, 0, 0, 0, 0, 0])
            i += 1
            continue
        if c == ")":
            if len(stack) > 1:
                frame = stack.pop()
                e, p = frame[0] + frame[1], frame[2] + frame[3]
                atom(e, p)
            i += 1
            continue
        if c == "|":
            frame = stack[-1]
            frame[0] += frame[1]
            frame[2] += frame[3]
            frame[1] = frame[3] = frame[4] = frame[5] = 0
            i += 1
            continue
        if c == "{":
            count, after = _counted_repeat(pattern, i)
            if count is not None:
                frame = stack[-1]
                # The last item becomes `count` copies of itself (at least one stays).
                added = frame[4] * (max(count, 1) - 1)
                frame[1] += added
                frame[4] += added
                i = after
                continue
        # a literal, '.', an anchor, or '*', '+', '?' (which copy nothing)
        if c not in "*+?":
            atom(1, 1)
        i += 1
    while len(stack) > 1:  # unclosed groups: RE2 refuses the pattern; count what is there
        frame = stack.pop()
        atom(frame[0] + frame[1], frame[2] + frame[3])
    frame = stack[0]
    return (frame[0] + frame[1]) - (frame[2] + frame[3])


def _class_end(pattern: str, start: int) -> int:
    """The index after the character class opening at ``start`` (``[^]a]``, ``[[:alpha:]]``
    and escapes inside handled), or len(pattern) when it does not close."""
    i, n = start + 1, len(pattern)
    if i < n and pattern[i] == "^":
        i += 1
    if i < n and pattern[i] == "]":  # a leading ']' is a member
        i += 1
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
        elif c == "[" and pattern.startswith("[:", i):
            close = pattern.find(":]", i + 2)
            i = i + 1 if close < 0 else close + 2
        elif c == "]":
            return i + 1
        else:
            i += 1
    return n


def _counted_repeat(pattern: str, start: int) -> tuple[int | None, int]:
    """(the count RE2 expands, the index after it) for ``{n}``, ``{n,}`` or ``{n,m}`` at
    ``start``; (None, start) when the brace is a literal (RE2's rule)."""
    close = pattern.find("}", start + 1)
    if close < 0:
        return None, start
    body = pattern[start + 1:close]
    low, comma, high = body.partition(",")
    if not low.isdigit() or (high and not high.isdigit()) or len(body) > 20:
        return None, start
    count = int(high) if high else int(low)
    return count, close + 1


class _DefinitionBudget:
    """Instructions left for the patterns of the definition being checked, and the pattern
    texts already charged (a repeated pattern is charged once)."""

    __slots__ = ("left", "seen")

    def __init__(self) -> None:
        self.left = MAX_DEFINITION_INSTRUCTIONS
        self.seen: set[str] = set()


_budget: contextvars.ContextVar[_DefinitionBudget | None] = contextvars.ContextVar("pattern_budget", default=None)


@contextlib.contextmanager
def definition_budget() -> Iterator[None]:
    """A budget of MAX_DEFINITION_INSTRUCTIONS for every ``problem`` inside the block (one
    definition's patterns: its conditions' and its input schema's), or the one already
    open (nested blocks share it)."""
    if _budget.get() is not None:
        yield
        return
    token = _budget.set(_DefinitionBudget())
    try:
        yield
    finally:
        _budget.reset(token)


def problem(pattern: str) -> str | None:
    """Why FlowForge will not run ``pattern`` (one sentence), or None when it will (it is
    then compiled and kept in the cache). See ``compiled``. Inside ``definition_budget``,
    a pattern first seen there is charged its program's instructions, and once the budget
    is spent every new pattern is refused without being compiled."""
    budget = _budget.get()
    if budget is not None and pattern in budget.seen:
        budget = None  # charged when first seen: a repeated pattern is the same program
    if budget is not None:
        if budget.left < 0:
            return _SPENT
        budget.seen.add(pattern)
    try:
        regex = compiled(pattern)
    except PatternRefused as exc:
        if budget is not None and "too large" in str(exc):
            budget.left -= _REFUSED_CHARGE
        return str(exc)
    if budget is not None:
        budget.left -= regex.programsize
        if budget.left < 0:
            return _SPENT
    return None


_SPENT = (f"the definition's patterns compile to more than {MAX_DEFINITION_INSTRUCTIONS} RE2 instructions in "
          "all; use fewer or smaller patterns")


def compiled(pattern: str):
    """``pattern`` compiled by RE2 (an ``re2._Regexp``; ``.search(text)``), from the
    process's cache when it was compiled before. Raises PatternRefused naming the reason:
    counted repeats adding more than MAX_REPEAT_COPIES copies (checked before compiling,
    so a refusal is immediate), a program over RE2_MAX_MEM_BYTES, or a syntax RE2 refuses
    (lookaround, backreferences)."""
    copies = repeat_copies(pattern)
    if copies > MAX_REPEAT_COPIES:
        raise PatternRefused(f"its counted repeats (x{{n,m}}) expand to {copies} copies; at most "
                             f"{MAX_REPEAT_COPIES} in one pattern")
    return _compile(pattern)


@functools.lru_cache(maxsize=COMPILED_CACHE_SIZE)
def _compile(pattern: str):
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        if "too large" in reason:
            reason = f"{reason}: its compiled program would exceed {RE2_MAX_MEM_BYTES // 1024} KiB"
        raise PatternRefused(reason) from None


class SearchRefused(ValueError):
    """A search FlowForge will not run: the text is too long for the pattern's program
    (``search_cost`` over MAX_SEARCH_COST); ``str(exc)`` says both sizes."""


def search_cost(regex, text: str) -> int:
    """What searching ``text`` with ``regex`` (from ``compiled``) may cost at worst:
    characters × instructions of its program (RE2's NFA, once the lazy DFA gives up)."""
    return len(text) * max(1, regex.programsize)


def search(regex, text: str) -> bool:
    """Whether ``regex`` (from ``compiled``) finds a match in ``text``. Raises SearchRefused,
    before searching, when ``search_cost`` is over MAX_SEARCH_COST."""
    cost = search_cost(regex, text)
    if cost > MAX_SEARCH_COST:
        raise SearchRefused(f"searching {len(text):,} characters with a pattern of {regex.programsize:,} "
                            f"instructions could cost {cost:,} steps, over {MAX_SEARCH_COST:,}: shorten the "
                            "text or the pattern")
    return regex.search(text) is not None


__all__ = ["COMPILED_CACHE_SIZE", "MAX_DEFINITION_INSTRUCTIONS", "MAX_REPEAT_COPIES", "MAX_SEARCH_COST",
           "RE2_MAX_MEM_BYTES", "PatternRefused", "SearchRefused", "compiled", "definition_budget", "problem",
           "repeat_copies", "search", "search_cost"]
