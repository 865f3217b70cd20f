"""Read this repository's GitHub Actions workflows as GitHub reads them: their triggers, jobs,
runners, the environment a step sees, and the `${{ }}` expressions they use (a small evaluator for the
operators those expressions need, so a rule such as "a push never cancels the nightly" is checked by
evaluating the concurrency group, not by matching its spelling)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"

# labels of GitHub's own runners that a self-hosted runner also carries (actionlint knows the rest)
STANDARD_SELF_HOSTED = {"self-hosted", "linux", "macos", "windows", "x64", "arm", "arm64"}


def load_all() -> dict[str, dict]:
    """Every workflow file by name (``conformance.yml``: its parsed YAML)."""
    files = sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
    return {f.name: yaml.safe_load(f.read_text()) for f in files}


def triggers(workflow: dict) -> dict:
    """The `on:` block as a dict of event: config (YAML 1.1 reads a bare `on` key as True)."""
    on = workflow.get("on", workflow.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {e: None for e in on}
    return dict(on)


def labels(job: dict) -> list[str]:
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):  # {group: ..., labels: ...}
        runs_on = runs_on.get("labels", [])
    return [runs_on] if isinstance(runs_on, str) else list(runs_on)


def self_hosted(job: dict) -> bool:
    return "self-hosted" in labels(job) or isinstance(job.get("runs-on"), dict)


def step_env(workflow: dict, job: dict, step: dict) -> dict:
    """The variables a step's process gets from the workflow, the job and the step itself."""
    return {**(workflow.get("env") or {}), **(job.get("env") or {}), **(step.get("env") or {})}


def uses(step: dict) -> str:
    """`owner/action` of a `uses:` step, without the ref ('' for a `run:` step)."""
    return step.get("uses", "").split("@")[0]


# -- expressions -----------------------------------------------------------------------------------
_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||!|\(|\))"
                    r"|(?P<name>[A-Za-z_][\w.\-]*))")


class ExpressionError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos, text = [], 0, text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExpressionError(f"cannot read {text[pos:]!r} in {text!r} (the test's evaluator knows literals, "
                                  "context names, ==, !=, &&, ||, ! and parentheses: extend it)")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def evaluate(text: str, context: dict):
    """Evaluate one GitHub expression (the text inside `${{ }}`, or a bare `if:`) over ``context``,
    a flat dict such as {"github.event_name": "push"}. Strings compare case-insensitively, as on
    GitHub; `a || b` and `a && b` return an operand, as on GitHub."""
    toks = _tokens(text)
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else (None, None)

    def take():
        nonlocal pos
        if pos == len(toks):
            raise ExpressionError(f"{text!r} ends too early")
        pos += 1
        return toks[pos - 1]

    def primary():
        kind, val = take()
        if kind == "op" and val == "(":
            v = either()
            if take() != ("op", ")"):
                raise ExpressionError(f"unbalanced parentheses in {text!r}")
            return v
        if kind == "op" and val == "!":
            return not truthy(primary())
        if kind == "str":
            return val[1:-1].replace("''", "'")
        if kind == "num":
            return float(val)
        if kind == "name":
            literals = {"true": True, "false": False, "null": None}
            if val in literals:
                return literals[val]
            if val not in context:
                raise ExpressionError(f"{val!r} is not in the test's context {sorted(context)} ({text!r})")
            return context[val]
        raise ExpressionError(f"unexpected {val!r} in {text!r}")

    def comparison():
        left = primary()
        while peek() in (("op", "=="), ("op", "!=")):
            op = take()[1]
            right = primary()
            same = (left.lower() == right.lower() if isinstance(left, str) and isinstance(right, str)
                    else left == right)
            left = same if op == "==" else not same
        return left

    def both():
        left = comparison()
        while peek() == ("op", "&&"):
            take()
            right = comparison()
            left = right if truthy(left) else left
        return left

    def either():
        left = both()
        while peek() == ("op", "||"):
            take()
            right = both()
            left = left if truthy(left) else right
        return left

    value = either()
    if pos != len(toks):
        raise ExpressionError(f"trailing {toks[pos:]} in {text!r}")
    return value


def truthy(v) -> bool:
    return v not in (None, False, 0, 0.0, "")


_EMBEDDED = re.compile(r"\$\{\{((?:(?!\}\}).)*)\}\}", re.S)


def value_of(field, context: dict):
    """A workflow field as GitHub evaluates it: a bool as is, a whole `${{ expr }}` as the expression's
    value, a string with embedded expressions as the string with each one substituted."""
    if not isinstance(field, str):
        return field
    whole = _EMBEDDED.fullmatch(field.strip())
    if whole:
        return evaluate(whole.group(1), context)
    return _EMBEDDED.sub(lambda m: str(evaluate(m.group(1), context)), field)


def condition(field, context: dict) -> bool:
    """An `if:` (absent: true; a bare expression without `${{ }}` is an expression too)."""
    if field is None:
        return True
    if isinstance(field, str) and not _EMBEDDED.search(field):
        field = "${{ " + field + " }}"
    return truthy(value_of(field, context))
