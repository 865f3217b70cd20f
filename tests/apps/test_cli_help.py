"""Every option of every ``gdncheck`` subcommand says what it does in ``--help``.

The test walks the argparse parser of gdncheck/cli.py, into every subcommand and every action of a
subcommand (``fixtures check``, ``tolerances derive``, ...), and asserts that each argument,
optional or positional, and each subcommand has a non-empty help text (``argparse.SUPPRESS``
counts as none: a hidden option is still an option a user can pass)."""

from __future__ import annotations

import argparse

from gdncheck.cli import COMMANDS, build_parser


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
    """(command path, parser) for ``parser`` and every subparser below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


def _blank(text) -> bool:
    return text is None or text == argparse.SUPPRESS or not str(text).strip()


def _missing_help() -> list[str]:
    missing = []
    for path, parser in _walk(build_parser(), ("gdncheck",)):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue  # argparse's own, with its own help
            if isinstance(action, argparse._SubParsersAction):
                listed = {choice.dest: choice.help for choice in action._choices_actions}
                missing += [f"{' '.join(path)} {name} (the subcommand)" for name in action.choices
                            if _blank(listed.get(name))]
                continue
            if _blank(action.help):
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_the_walk_reaches_every_command_and_action():
    paths = {path for path, _ in _walk(build_parser(), ("gdncheck",))}
    assert {("gdncheck", name) for name in COMMANDS} <= paths
    for nested in [("fixtures", "check"), ("fixtures", "list"), ("tolerances", "show"), ("tolerances", "derive")]:
        assert ("gdncheck", *nested) in paths


def test_every_option_of_every_subcommand_has_help():
    missing = _missing_help()
    assert not missing, "options without help:\n  " + "\n  ".join(missing)


def test_tolerances_help_names_derives_default_suite():
    """``tolerances --help`` says what ``derive`` derives from when --suite is not given."""
    parser = build_parser()
    tol = dict(_walk(parser, ("gdncheck",)))[("gdncheck", "tolerances")]
    derive = dict(_walk(parser, ("gdncheck",)))[("gdncheck", "tolerances", "derive")]
    default = next(a.default for a in derive._actions if "--suite" in a.option_strings)
    text = tol.format_help()
    assert f"--suite {default}" in text or f"{default} suite" in text, text
