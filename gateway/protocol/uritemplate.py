"""RFC 6570 URI templates read backwards: could this template have produced this URI, and with which values?

Used to route a `resources/read` to the upstream server whose resource template matches the URI. All of
levels 1-4 parse (operators none, `+`, `#`, `.`, `/`, `;`, `?`, `&`; modifiers `:N` and `*`). Expansion is
not one-to-one, so matching follows these rules:

- Literal text must appear exactly as written (no case folding, no percent-decoding of literals).
- Values are percent-decoded (`urllib.parse.unquote`, UTF-8, bad bytes become U+FFFD); raw non-ASCII
  characters (IRI style) are accepted as themselves. A value may contain:
  - `{var}`: anything but `/`, `?`, `#` (so a simple variable is at most one path segment);
  - `{+var}`, `{#var}`: anything at all, `/`, `?` and `#` included;
  - `{.var}`: anything but `/`, `?`, `#`;  `{/var}`: anything but `/`, `?`, `#`;
  - `{;var}`: anything but `;`, `/`, `?`, `#`;  `{?var}`, `{&var}`: anything but `&` and `#`;
  - and, when the expression has several variables or an exploded one, not its separator
    (`,` for none/`+`/`#`, `.` for `.`, `/` for `/`).
- Unnamed operators (none, `+`, `#`, `.`, `/`) are positional: with fewer values than variables the values go
  to the leading variables and the rest are absent from the result (`{x,y}` on `1024` gives only `x`). An
  expression with a leading character (`#`, `.`, `/`) that is missing altogether leaves all its variables
  absent; none/`+` expressions always give their first variable, possibly `""`.
- Named operators (`;`, `?`, `&`) match their parameters by name, in any order and any subset (each
  non-exploded name at most once); `name` alone and `name=` both mean `""`. A parameter whose name is not in
  the expression makes the URI a non-match, unless the expression has an exploded variable: then it is taken
  as a key of that (associative array) variable and kept as a `"name=value"` item of its list.
- An exploded variable (`*`) always yields a `list[str]`: its items split on the operator's separator
  (`{/id*}` takes one or more segments; `{;list*}`/`{?list*}` collect every `list=...`). Items of an exploded
  associative array come back as `"key=value"`. A non-exploded variable always yields a `str`; a list or
  associative array expanded without `*` comes back as its comma-joined text.
- A prefix `{var:N}` takes at most N characters of the decoded value. A variable that occurs several times
  (`{/var:1,var}`) must take consistent values; the longest is returned.
- Expressions are greedy left to right: an earlier expression takes as much as it can while the rest still
  matches (`{+path}/{name}` on `/a/b/c` gives `path="/a/b"`, `name="c"`). Expressions that touch (no literal
  between them) are taken together as one span, greedy like the rest, which is then split with the earlier
  ones taking as little as they can: `file:///{+path}{?rev}` on `file:///a?rev=1` gives `path="a"`,
  `rev="1"`, and `up{+path}{var}/here` on `up/foo/barvalue/here` gives `path="/foo/"`, `var="barvalue"`.
  Within one expression, an exploded variable followed by other variables leaves them a value each when it
  can (`{/list*,path:4}` on `/red/green/blue/%2Ffoo` gives `list=["red","green","blue"]`, `path="/foo"`).

Literals may hold any character but `{` and `}`. Each template is compiled once to a regular expression;
`match` first checks that the literal texts occur in order (cheap, and it spares the regex a hopeless URI).
A run of touching expressions is one group of any of their characters in that regex, so they cannot
backtrack against each other (the run's own regex then splits the span; only when that fails is the exact,
slower regex tried). What remains superlinear: several expressions that may hold the same literal between
them (`{+a}/{+b}x{c}` on a long run of `/`) backtrack over its occurrences on a URI that does not match.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote

Values = dict[str, str | list[str]]


@dataclass(frozen=True, slots=True)
class _Operator:
    first: str
    sep: str
    named: bool
    excluded: str  # characters a value of this operator never holds (besides the separator, where it applies)


_OPERATORS: Final[dict[str, _Operator]] = {
    "": _Operator("", ",", False, "/?#"),
    "+": _Operator("", ",", False, ""),
    "#": _Operator("#", ",", False, ""),
    ".": _Operator(".", ".", False, "/?#"),
    "/": _Operator("/", "/", False, "/?#"),
    ";": _Operator(";", ";", True, "/?#"),
    "?": _Operator("?", "&", True, "#"),
    "&": _Operator("&", "&", True, "#"),
}
_RESERVED_OPERATORS: Final = "=,!@|"
_VARNAME: Final = re.compile(r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})(?:\.?(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*")
_MAX_LENGTH: Final = re.compile(r"[1-9][0-9]{0,3}")
_WHOLE: Final = sys.maxsize  # the "prefix" of a variable without `:N`
# One character, percent-encoded as UTF-8 (1 to 4 triplets); used to count the characters of a prefix.
_ENCODED_CHAR: Final = (
    r"%[0-7][0-9A-Fa-f]"
    r"|%[CDcd][0-9A-Fa-f]%[89ABab][0-9A-Fa-f]"
    r"|%[Ee][0-9A-Fa-f](?:%[89ABab][0-9A-Fa-f]){2}"
    r"|%[Ff][0-7](?:%[89ABab][0-9A-Fa-f]){3}"
)


@dataclass(frozen=True, slots=True)
class _Var:
    name: str
    prefix: int  # 0 for none
    explode: bool


@dataclass(frozen=True, slots=True)
class _Expression:
    operator: _Operator
    variables: tuple[_Var, ...]
    group: int  # in its run's regex: named, the group of all its parameters; unnamed, that of its first variable


@dataclass(frozen=True, slots=True)
class _Run:
    """Touching expressions (no literal between them), which the template regex takes as one span."""

    expressions: tuple[_Expression, ...]
    regex: re.Pattern[str]  # splits the span among the expressions, earlier ones taking as little as they can
    fast: int  # the group offset of its expressions, or of its span if it has several, in the template regex
    exact: int  # the group offset of its expressions in the exact regex


def _char(excluded: str) -> str:
    """A regex for one character not in `excluded`."""
    return f"[^{re.escape(excluded)}]" if excluded else "."


def _unit(excluded: str) -> str:
    """A regex for one character of a value, a percent-encoded character counting as one."""
    return f"(?:{_ENCODED_CHAR}|%(?![0-9A-Fa-f]{{2}})|[^%{re.escape(excluded)}])"


class UriTemplate:
    """A parsed, compiled RFC 6570 URI template that matches concrete URIs (rules in the module docstring)."""

    __slots__ = (
        "_exact",
        "_expressions",
        "_head",
        "_inner",
        "_names",
        "_regex",
        "_runs",
        "_specificity",
        "_tail",
        "_text",
    )

    def __init__(self, text: str) -> None:
        """Parse and compile `text`; `ValueError` names what is wrong with an invalid template."""
        self._text = text
        literals: list[str] = []
        parsed: list[list[tuple[_Operator, tuple[_Var, ...]]]] = []  # runs of touching expressions
        position = 0
        while True:
            start = _next_brace(text, position)
            literal = text[position : len(text) if start < 0 else start]
            if start < 0:
                literals.append(literal)
                break
            end = text.find("}", start + 1)
            nested = text.find("{", start + 1, len(text) if end < 0 else end)
            if end < 0 or nested >= 0:
                raise ValueError(f"unclosed '{{' at position {start}")
            if parsed and not literal:
                parsed[-1].append(_parse_expression(text[start : end + 1]))
            else:
                literals.append(literal)
                parsed.append([_parse_expression(text[start : end + 1])])
            position = end + 1
        self._compile(literals, parsed)
        self._head = literals[0]
        self._tail = literals[-1] if parsed else ""
        self._inner = tuple(literals[1:-1])
        names: dict[str, None] = {}
        for expression in self._expressions:
            names.update((v.name, None) for v in expression.variables)
        self._names = tuple(names)
        wide = sum(1 for e in self._expressions if e.operator.excluded == "" or _exploded(e) >= 0)
        self._specificity = (
            sum(len(lit) for lit in literals),
            -wide,
            len(self._head),
            -sum(len(e.variables) for e in self._expressions),
        )

    def _compile(self, literals: list[str], parsed: list[list[tuple[_Operator, tuple[_Var, ...]]]]) -> None:
        """Build the template regex, where a run of several touching expressions is one span of any of their
        characters (so they cannot backtrack against each other), and the exact regex to fall back on."""
        fast, exact = [re.escape(literals[0])], [re.escape(literals[0])]
        fast_groups = exact_groups = 0
        runs: list[_Run] = []
        for run, literal in zip(parsed, literals[1:], strict=True):
            expressions: list[_Expression] = []
            capturing = []
            groups = 0
            for index, (operator, variables) in enumerate(run):
                expression = _Expression(operator, variables, groups + 1)
                regex, count = _expression_regex(expression, lazy=index < len(run) - 1)
                capturing.append(regex)
                expressions.append(expression)
                groups += count
            runs.append(_Run(tuple(expressions), re.compile("".join(capturing), re.DOTALL), fast_groups, exact_groups))
            fast.append("".join(capturing) if len(run) == 1 else f"({_char(_run_excluded(run))}*)")
            exact.append("".join(capturing))
            fast_groups += groups if len(run) == 1 else 1
            exact_groups += groups
            fast.append(re.escape(literal))
            exact.append(re.escape(literal))
        self._runs = tuple(runs)
        self._expressions = tuple(e for run in runs for e in run.expressions)
        self._regex = re.compile("".join(fast), re.DOTALL)
        several = any(len(run.expressions) > 1 for run in runs)
        self._exact = re.compile("".join(exact), re.DOTALL) if several else None

    @classmethod
    def parse(cls, text: str) -> UriTemplate:
        """Parse and compile a template; `ValueError` names the problem (unclosed brace, bad operator, ...)."""
        return cls(text)

    @property
    def text(self) -> str:
        """The template as given."""
        return self._text

    @property
    def variables(self) -> tuple[str, ...]:
        """The variable names, each once, in order of first appearance."""
        return self._names

    @property
    def specificity(self) -> tuple[int, int, int, int]:
        """A sort key where larger means more specific: prefer `max(matching, key=lambda t: t.specificity)`.

        The tuple is (literal characters, minus the number of wide expressions -- `+`, `#` or with an exploded
        variable, which can span segments --, length of the literal text before the first expression, minus
        the number of variables). So `file:///readme.txt` beats `file:///{name}.txt`, which beats
        `file:///{name}`, which beats `file:///{+path}`.
        """
        return self._specificity

    def match(self, uri: str) -> Values | None:
        """The decoded variable values if `uri` could have been expanded from this template, else None.

        Variables the URI gives no value for are absent, so `{}` is a match: test the result with `is None`.
        """
        if not uri.startswith(self._head) or not uri.endswith(self._tail):
            return None
        position = len(self._head)
        for literal in self._inner:  # cheap, and spares the regex from backtracking over a hopeless URI
            position = uri.find(literal, position)
            if position < 0:
                return None
            position += len(literal)
        found = self._regex.fullmatch(uri)
        if found is None:
            return None
        split: list[tuple[re.Match[str], int]] = []
        for run in self._runs:
            if len(run.expressions) == 1:
                split.append((found, run.fast))
                continue
            inner = run.regex.fullmatch(found.group(run.fast + 1))
            if inner is None:  # the span holds characters in a way the run cannot: try every split
                return self._match_exactly(uri)
            split.append((inner, 0))
        return self._values(split)

    def _match_exactly(self, uri: str) -> Values | None:
        """`match` with the exact regex, which may backtrack through touching expressions."""
        found = self._exact.fullmatch(uri) if self._exact is not None else None
        if found is None:
            return None
        return self._values([(found, run.exact) for run in self._runs])

    def _values(self, split: list[tuple[re.Match[str], int]]) -> Values | None:
        """The variable values from each run's match and group offset; None if they are inconsistent."""
        values: list[tuple[_Var, str | list[str]]] = []
        for run, (found, offset) in zip(self._runs, split, strict=True):
            for expression in run.expressions:
                group = offset + expression.group
                if expression.operator.named:
                    raw = found.group(group)
                    if raw is not None and not _named_values(expression, raw, values):
                        return None
                    continue
                for index, var in enumerate(expression.variables):
                    raw = found.group(group + index)
                    if raw is None:
                        break
                    sep = expression.operator.sep
                    values.append((var, [unquote(i) for i in raw.split(sep)] if var.explode else unquote(raw)))
        merged = _merge(values)
        if merged is None:
            return None
        return {name: merged[name] for name in self._names if name in merged}

    def __repr__(self) -> str:
        return f"UriTemplate({self._text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UriTemplate) and other._text == self._text

    def __hash__(self) -> int:
        return hash(self._text)


def overlaps(a: UriTemplate, b: UriTemplate) -> bool:
    """Whether some URI might match both templates; conservative, so True may be a false alarm.

    A template without expressions overlaps another exactly when the other matches its text. Otherwise the
    templates overlap unless their literal texts before the first expression differ (neither is a prefix of
    the other) or their literal texts after the last expression differ (neither is a suffix of the other).
    """
    if not a._expressions:
        return b.match(a.text) is not None
    if not b._expressions:
        return a.match(b.text) is not None
    heads = a._head.startswith(b._head) or b._head.startswith(a._head)
    tails = a._tail.endswith(b._tail) or b._tail.endswith(a._tail)
    return heads and tails


def _next_brace(text: str, position: int) -> int:
    """Where the next `{` is (-1 for none); `ValueError` for a `}` before it."""
    start = text.find("{", position)
    close = text.find("}", position, len(text) if start < 0 else start)
    if close >= 0:
        raise ValueError(f"unmatched '}}' at position {close}")
    return start


def _parse_expression(expression: str) -> tuple[_Operator, tuple[_Var, ...]]:
    """The operator and variables of one `{...}`, braces included."""
    body = expression[1:-1]
    if not body:
        raise ValueError("empty expression '{}'")
    symbol = body[0] if body[0] in _OPERATORS else ""
    if body[0] in _RESERVED_OPERATORS:
        raise ValueError(f"reserved operator {body[0]!r} in {expression!r}")
    if not symbol and not _VARNAME.match(body) and body[0] not in ",:*":
        raise ValueError(f"unknown operator {body[0]!r} in {expression!r}")
    variables = []
    for spec in body[len(symbol) :].split(","):
        if not spec:
            raise ValueError(f"empty variable name in {expression!r}")
        name = _VARNAME.match(spec)
        if name is None:
            if spec[0] in ":*":
                raise ValueError(f"empty variable name in {expression!r}")
            raise ValueError(f"invalid variable name {spec!r} in {expression!r}")
        varname, modifier = name.group(), spec[name.end() :]
        if modifier and modifier[0] not in ":*":
            raise ValueError(f"invalid variable name {spec!r} in {expression!r}")
        if modifier == "*":
            variables.append(_Var(varname, 0, True))
        elif modifier.startswith(":") and _MAX_LENGTH.fullmatch(modifier[1:]):
            variables.append(_Var(varname, int(modifier[1:]), False))
        elif modifier.startswith(":"):
            raise ValueError(f"invalid prefix modifier {modifier!r} on {varname!r} in {expression!r} (use :1 to :9999)")
        elif modifier:
            raise ValueError(f"invalid modifier {modifier!r} on {varname!r} in {expression!r} (use * or :N)")
        else:
            variables.append(_Var(varname, 0, False))
    return _OPERATORS[symbol], tuple(variables)


def _exploded(expression: _Expression) -> int:
    """The index of the first exploded variable of the expression, -1 for none."""
    return next((i for i, v in enumerate(expression.variables) if v.explode), -1)


def _run_excluded(run: list[tuple[_Operator, tuple[_Var, ...]]]) -> str:
    """The characters that no expression of a run can match (its leading characters and separators can)."""
    common = set.intersection(*(set(op.excluded) - {op.first, op.sep} for op, _ in run))
    return "".join(sorted(common))


def _expression_regex(expression: _Expression, lazy: bool) -> tuple[str, int]:
    """The regex for one expression and how many groups it holds; `lazy` makes it take as little as it can."""
    op, variables = expression.operator, expression.variables
    first, sep, q = re.escape(op.first), re.escape(op.sep), "?" if lazy else ""
    if op.named:
        value = _char(op.excluded + op.sep)
        if _exploded(expression) >= 0:
            names = f"[^={re.escape(op.excluded + op.sep)}]+"
        else:
            names = "|".join(re.escape(n) for n in sorted({v.name for v in variables}, key=len, reverse=True))
        pair = f"(?:{names})(?:={value}*{q})?{q}"
        return f"(?:{first}({pair}(?:{sep}{pair})*{q}))?{q}", 1
    several = len(variables) > 1
    parts = []
    for index, var in enumerate(variables):
        excluded = op.excluded + (op.sep if several or var.explode else "")
        if var.explode:
            item = f"{_char(excluded)}*{q}"
            rest = "?" if lazy or index < len(variables) - 1 else ""
            parts.append(f"({item}(?:{sep}{item})*{rest})")
        elif var.prefix:
            parts.append(f"({_unit(excluded)}{{0,{var.prefix}}}{q})")
        else:
            parts.append(f"({_char(excluded)}*{q})")
    regex = parts[-1]
    for part in reversed(parts[:-1]):
        regex = f"{part}(?:{sep}{regex})?{q}"
    return (f"(?:{first}{regex})?{q}" if op.first else regex), len(variables)


def _named_values(expression: _Expression, raw: str, values: list[tuple[_Var, str | list[str]]]) -> bool:
    """Add the values of a named expression's parameters to `values`; False if the URI cannot match."""
    variables = expression.variables
    catch_all = _exploded(expression)
    taken: set[int] = set()
    lists: dict[int, list[str]] = {}
    for parameter in raw.split(expression.operator.sep):
        name, equals, value = parameter.partition("=")
        index = next(
            (i for i, v in enumerate(variables) if v.name == name and (v.explode or i not in taken)),
            -1,
        )
        if index < 0:
            if catch_all < 0:
                return False
            key = unquote(name)
            lists.setdefault(catch_all, []).append(f"{key}={unquote(value)}" if equals else key)
            continue
        var = variables[index]
        if var.explode:
            lists.setdefault(index, []).append(unquote(value))
            continue
        text = unquote(value)
        if var.prefix and len(text) > var.prefix:
            return False
        taken.add(index)
        values.append((var, text))
    values.extend((variables[i], items) for i, items in lists.items())
    return True


def _merge(values: list[tuple[_Var, str | list[str]]]) -> Values | None:
    """One value per name; None if a repeated variable took inconsistent values."""
    merged: Values = {}
    limits: dict[str, int] = {}
    for var, value in values:
        limit = var.prefix or _WHOLE
        if var.name not in merged:
            merged[var.name], limits[var.name] = value, limit
            continue
        shared = min(limit, limits[var.name])
        if _joined(merged[var.name])[:shared] != _joined(value)[:shared]:
            return None
        if limit > limits[var.name] or (limit == limits[var.name] and isinstance(value, list)):
            merged[var.name], limits[var.name] = value, limit
    return merged


def _joined(value: str | list[str]) -> str:
    """A value as text: a list as its comma-joined items (as it would expand without `*`)."""
    return value if isinstance(value, str) else ",".join(value)
