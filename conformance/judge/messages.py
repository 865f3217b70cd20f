"""Failure messages in one grammar: *what was observed, but what should be expected [where]*,
each standing alone, then a one-line repro command.

    core (delta_rule) of call 1: max scaled error 3.1e-01 at [0, 17, 3, 5]: 0.412345, but should be
    0.399812 ± 0.00621 (elem bound 0.23, case prefill-decode_T65_Hk2_Hv6_dk16_dv8, bf16); 14 / 4096
    elements (0.34%) over the bound, first at token 3 (position 64, row 0); NMSE 2.1e-05 (46.8 dB),
    bound 1.0e-05 [case prefill-decode_T65_Hk2_Hv6_dk16_dv8_s0, step 2: forward seq_pos [61, 61]]

What failed is kept apart from how it is said, as torch.testing's ``ErrorMeta`` does: a builder makes a
:class:`Failure` (the :class:`Subject`, what was found, what was expected, the :class:`Where`, the
count over the bound and where the first of them is, notes), and ``str(failure)`` says it. A kind of
call that knows more about where a failure is (a packed call's sequence, a pool's slots) changes the
failure's parts and says it again (:func:`relocate`, :func:`add_note`), never edits its text.

Every builder takes keyword arguments only: a message has many parts of the same type (numbers,
strings), and a swapped pair would read as a plausible, wrong message.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field


def fmt(x: float) -> str:
    return f"{x:.6g}"


@dataclass(frozen=True)
class Where:
    """The step of the program a failure belongs to; ``step`` None: the case as a whole."""

    case: str
    step: int | None = None
    op: str | None = None
    seq_pos: Sequence[int] | None = None

    def __str__(self) -> str:
        if self.step is None:
            return f"[case {self.case}]"
        pos = f" seq_pos {list(self.seq_pos)}" if self.seq_pos is not None else ""
        return f"[case {self.case}, step {self.step}: {self.op}{pos}]"


@dataclass(frozen=True)
class Subject:
    """What failed: a tensor of a call (of its stage), or a tensor of a saved snapshot file."""

    tensor: str
    stage: str | None = None
    call: int | None = None
    snapshot: str | None = None

    def __str__(self) -> str:
        if self.snapshot:
            return f"{self.tensor} of the saved snapshot {self.snapshot}"
        return f"{self.tensor} ({self.stage}) of call {self.call}"


@dataclass
class Failure:
    """One failure, in parts: ``str()`` says ``subject: found, but should expected; over, first at first;
    details... [where] notes...``."""

    found: str
    expected: str  # what follows "but should ": "be 0.3998 ± 0.0062 (...)", "raise seq_pos_mismatch ..."
    subject: Subject | str | None = None
    where: Where | str | None = None  # a step of a case, or (a property draw) a description of it
    over: str | None = None  # how many elements are over the bound
    first: str | None = None  # where the first of them is
    details: tuple[str, ...] = ()  # what else was measured
    notes: list[str] = field(default_factory=list)  # what a kind of call adds after the location

    def __str__(self) -> str:
        text = f"{self.subject}: {self.found}" if self.subject is not None else self.found
        text += f", but should {self.expected}"
        if self.over:
            text += f"; {self.over}" + (f", first at {self.first}" if self.first else "")
        text += "".join(f"; {d}" for d in self.details)
        if self.where is not None:
            text += f" {self.where}"
        return text + "".join(f" {n}" for n in self.notes)


def fail(rec, reason: str, failure: Failure):
    """``rec`` fails for ``reason``: its failure in parts, and its message said from them."""
    rec.verdict, rec.reason, rec.failure, rec.message = "fail", reason, failure, str(failure)
    return rec


def relocate(rec, first: str, note: str) -> None:
    """Say ``rec``'s failure again with its first element over the bound at ``first``, and ``note``."""
    failure = getattr(rec, "failure", None)
    if failure is None:
        if rec.message:
            rec.message += f" {note}"
        return
    if failure.first is not None:
        failure.first = first
    failure.notes.append(note)
    rec.message = str(failure)


def add_note(rec, note: str) -> None:
    """Add ``note`` after ``rec``'s failure (a failure of no parts: after its text)."""
    failure = getattr(rec, "failure", None)
    if failure is None:
        rec.message = f"{rec.message or ''} {note}"
        return
    failure.notes.append(note)
    rec.message = str(failure)


def bound_failure(*, subject: Subject | str, metrics: dict, bound: dict, actual: float, expected: float,
                  allowed: float, over: int, first: tuple[int, int, int] | None, elem_failed: bool,
                  where: Where | str) -> Failure:
    """A tensor over its bound: the worst element (``actual`` where ``expected`` ± ``allowed``), how many
    elements are ``over``, the ``first`` (token, position, row) over it, and the NMSE."""
    m = metrics
    numel = m["numel"]
    pct = 100.0 * over / numel if numel else 0.0
    src = f"{bound['source']}, {bound['profile']}"
    nmse = f"NMSE {m['nmse']:.2e} ({m['sqnr_db']:.1f} dB)"
    if elem_failed:
        return Failure(subject=subject, where=where,
                       found=f"max scaled error {m['max_err']:.2e} at {m['max_err_index']}: {fmt(actual)}",
                       expected=f"be {fmt(expected)} ± {allowed:.3g} (elem bound {bound['elem']:.3g}, {src})",
                       over=f"{over} / {numel} elements ({pct:.3g}%) over the bound",
                       first=f"token {first[0]} (position {first[1]}, row {first[2]})" if first else None,
                       details=(f"{nmse}, bound {bound['nmse']:.2e}",))
    return Failure(subject=subject, where=where, found=nmse,
                   expected=f"be at most {bound['nmse']:.2e} (nmse bound, {src})",
                   details=(f"max scaled error {m['max_err']:.2e} at {m['max_err_index']} "
                            f"(elem bound {bound['elem']:.3g})",))


def with_regime(message: str | None, regime: str | None) -> str | None:
    """A failure message of a case that probes an edge names the edge, so that a port sees whether it
    differs in the realistic regime or only there: ``...; [case ..., step ...] (edge: q/k squared
    norm ≈ eps)``."""
    if message is None or not regime or regime == "realistic":
        return message
    return f"{message} ({regime})"


def shape_failure(*, subject: Subject | str, shape, expected, where: Where | str) -> Failure:
    return Failure(subject=subject, where=where, found=f"shape {list(shape)}", expected=f"be {list(expected)}")


def dtype_failure(*, subject: Subject | str, dtype: str, allowed: tuple[str, ...], why: str,
                  where: Where | str) -> Failure:
    return Failure(subject=subject, where=where, found=f"dtype {dtype}", expected=f"be {' or '.join(allowed)} ({why})")


def nan_failure(*, subject: Subject | str, count: int, index, where: Where | str) -> Failure:
    return Failure(subject=subject, where=where, found=f"{count} NaN value(s), first at {index}",
                   expected="be finite (NaN fails everywhere)")


def inf_failure(*, subject: Subject | str, count: int, index, actual: float, expected: float,
                where: Where | str) -> Failure:
    return Failure(subject=subject, where=where, found=f"{count} unmatched infinity(ies), first at {index}: {actual}",
                   expected=f"be {fmt(expected)} (an infinity passes only where the expected value is the same "
                            "infinity)")


def missing_required(*, subject: Subject | str, key: str, where: Where | str) -> Failure:
    return Failure(subject=subject, where=where, found=f"no tensor {key} in the outputs",
                   expected="be there (every call writes out, conv_state and recurrent_state)")


def snapshot_missing(*, subject: Subject | str, problem: str, where: Where | str) -> Failure:
    return Failure(subject=subject, where=where, found=problem, expected="be there (the program saves it)")


def seq_len_failure(*, subject: Subject | str, actual, expected, where: Where | str) -> Failure:
    """``actual``: the counts found, or (a tensor of the wrong dtype or shape) a description of it."""
    found = actual if isinstance(actual, str) else list(actual)
    return Failure(subject=subject, where=where, found=f"seq_len {found}",
                   expected=f"be {list(expected)} (integers, seq_pos + T; docs/spec.md §4)")


def raised(*, case: str, err: dict, op: str) -> Failure:
    return Failure(found=f"the implementation raised {err.get('code')} at step {err.get('step')} ({op}): "
                         f"{err.get('message')}", expected="have run the whole program", where=Where(case))


def error_expected(*, case: str, expected: dict, op: str) -> Failure:
    alts = [c for c in expected["accept"] if c != expected["code"]]
    alt = f" (or the more general {', '.join(alts)})" if alts else ""
    return Failure(found="the implementation raised nothing", where=Where(case),
                   expected=f"raise {expected['code']}{alt} at step {expected['step']} ({op})")


def wrong_error(*, case: str, err: dict, expected: dict, op: str) -> Failure:
    return Failure(found=f"the implementation raised {err.get('code')} at step {err.get('step')}: {err.get('message')}",
                   expected=f"raise {expected['code']} at step {expected['step']} ({op})", where=Where(case))


def not_applicable_required(*, case: str, na: dict) -> Failure:
    """A port declared not applicable a case that needs no optional feature (the coverage rule)."""
    return Failure(found=f"the implementation declared the case not applicable from step {na['step']} ({na['op']}): "
                         f"{na['reason']}", where=Where(case),
                   expected="run it: it needs no optional feature, and every conforming port is judged on it "
                            "(FORMAT.md §2, coverage)")


def nothing_judged(*, case: str, missing: int, mode: str) -> Failure:
    """A case in which no tensor was judged: nothing it wrote is a tensor the goldens expect."""
    return Failure(found=f"no tensor of the case was judged ({missing} expected tensor(s) not provided, in mode "
                         f"{mode})", where=Where(case),
                   expected="be: a case that judged nothing is no pass (write the expected tensors under their "
                            "names, or verify with --names TABLE)")


def not_applicable(*, na: dict, passed: int) -> str:
    """A case the implementation cannot express from step ``na['step']``; ``passed`` records before it pass."""
    return (f"not applicable from step {na['step']} ({na['op']}): {na['reason']}"
            + (f"; the {passed} tensor(s) of the steps before it pass" if passed else ""))


def repro(fixtures: str, outputs: str, profile: str, case: str, *, stage_isolated: bool = False,
          fused: bool = False, run_command: str | None = None, names: str | None = None) -> str:
    """One line that reruns the check of one case (and the run that made its outputs, if known);
    ``names``: the name table verify read the outputs through (``--names``), without which the port's
    own names are unknown and the case fails otherwise.

    Every word is gdncheck's own and quoted by it (``shlex.quote``): ``run_command`` (an outputs file's
    ``command``: a port's text) gives the run only its implementation, where that is gdncheck's own (a
    built-in name, or a module of the ``gdncheck`` package: :func:`own_implementation`), and its
    ``--option`` values; its folder, suite and profile are verify's own (``--fixtures`` the suite judged
    against, never the one the port names). Any other command (a shell pipeline, a port's own runner, a
    module of the port's choosing) is left out: it is data, never a prefix a user pastes."""
    iso = ["--fused"] if fused else ["--stage-isolated"] if stage_isolated else []
    iso += ["--names", str(names)] if names else []
    verify = shlex.join(["gdncheck", "verify", "--fixtures", str(fixtures), "--outputs", str(outputs),
                         "--profile", str(profile), *iso, "--case", str(case)])
    run = run_line(run_command, fixtures, outputs, profile, stage_isolated or fused, case)
    return f"{run} && {verify}" if run else verify


def own_implementation(word: str) -> bool:
    """Whether a ``gdncheck run`` implementation word is gdncheck's own: a one-word name (``gdncheck run``
    takes one only as a built-in, and refuses any other before importing anything) or ``MODULE:CALLABLE``
    of a module of the ``gdncheck`` package."""
    return ":" not in word or word.split(":", 1)[0].startswith("gdncheck.")


def run_line(run_command: object, fixtures: str, outputs: str, profile: str, stage_isolated: bool,
             case: str) -> str | None:
    """The ``gdncheck run`` that reruns ``case`` into ``outputs`` from ``fixtures`` in ``profile``, with the
    implementation and ``--option`` values of ``run_command`` where it is such a command of gdncheck's own
    implementation (:func:`own_implementation`); else None."""
    words = run_words(run_command)
    if not words or not own_implementation(words[2]):
        return None
    options = [w for i, w in enumerate(words[3:], 3) if words[i - 1] == "--option" and RUN_OPTIONS.get(w) is None]
    return shlex.join(["gdncheck", "run", words[2], "--fixtures", str(fixtures), "--out", str(outputs), "--profile",
                       str(profile), *(w for o in options for w in ("--option", o)),
                       *(["--stage-isolated"] if stage_isolated else []), "--case", str(case)])


#: the options a repro line may carry, per command: option -> whether it takes a value
RUN_OPTIONS = {"--fixtures": True, "--out": True, "--profile": True, "--case": True, "--tag": True, "--shard": True,
               "--option": True, "--stage-isolated": False, "--overwrite": False, "-q": False, "--quiet": False}
VERIFY_OPTIONS = {"--fixtures": True, "--outputs": True, "--profile": True, "--case": True, "--names": True,
                  "--tolerances": True, "--stage-isolated": False, "--fused": False,
                  "--allow-looser-tolerances": False}
#: an implementation a repro may name: a built-in name (one word), or MODULE:CALLABLE of dotted Python
#: identifiers (what gdncheck run's parse_spec takes; it refuses any other when the line is run)
_IMPL = re.compile(r"[a-z][a-z0-9_]*|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*")
#: characters a shell reads as operators outside quotes
_OPERATORS = ";&|<>()"
MAX_COMMAND = 8192


def _command_words(text: object, command: str, options: dict[str, bool], positional: re.Pattern | None):
    """The words of ``text`` if it is ``gdncheck COMMAND [POSITIONAL] OPTION...`` of ``options`` with no
    shell operator outside quotes (a ``;``, ``|``, ``&&``, redirection or subshell) and no line
    break; else None."""
    if not isinstance(text, str) or len(text) > MAX_COMMAND or "\n" in text or "\r" in text:
        return None
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars=_OPERATORS)
        lex.whitespace_split = True
        words = list(lex)
    except ValueError:
        return None
    if any(w and set(w) <= set(_OPERATORS) for w in words) or words[:2] != ["gdncheck", command]:
        return None
    i = 2
    if positional is not None:
        if len(words) < 3 or not positional.fullmatch(words[2]):
            return None
        i = 3
    while i < len(words):
        takes = options.get(words[i])
        if takes is None or (takes and i + 1 >= len(words)):
            return None
        i += 2 if takes else 1
    return words


def run_words(command: object) -> list[str] | None:
    """The words of ``command`` (an outputs file's ``command`` metadata) if it is a ``gdncheck run``
    command gdncheck can quote: ``gdncheck run IMPL`` and options of :data:`RUN_OPTIONS`, no shell
    operator outside quotes; else None."""
    return _command_words(command, "run", RUN_OPTIONS, _IMPL)


def checked_repro(text: object) -> str | None:
    """``text`` (a summary's repro line, read back from a file) in the form :func:`repro` writes, every
    word quoted again by gdncheck, or None when it is not such a line: ``[gdncheck run ... --case ID
    && ]gdncheck verify ...`` of the two commands' own options, nothing else before, between or after."""
    if not isinstance(text, str) or len(text) > 2 * MAX_COMMAND:
        return None
    parts = text.split(" && ")
    if len(parts) > 2:
        return None
    verify = _command_words(parts[-1], "verify", VERIFY_OPTIONS, None)
    if verify is None:
        return None
    line = shlex.join(verify)
    if len(parts) == 2:
        run = run_words(parts[0])
        if run is None:
            return None
        # the run only as :func:`run_line` writes it from the verify's own words: its suite, folder, profile,
        # mode and case (a line whose run names another suite, or a module of a port's choosing, is cut to the
        # verify it holds)
        said = {verify[i]: verify[i + 1] for i in range(2, len(verify) - 1)}
        mode = "--stage-isolated" in verify or "--fused" in verify
        own = run_line(parts[0], said.get("--fixtures"), said.get("--outputs"), said.get("--profile"), mode,
                       said.get("--case"))
        if own is not None and shlex.join(run) == own and None not in (
                said.get("--fixtures"), said.get("--outputs"), said.get("--profile"), said.get("--case")):
            line = f"{own} && {line}"
    return line
