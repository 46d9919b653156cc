"""The ``ascend-emu`` argument parser class: argparse's, with "did you mean" suggestions.

argparse reports a mistyped option badly: ``inspect where --slott 3`` says that ``--slot`` is
missing (the required-option check runs before unknown options are reported), ``demo --contxt``
prints the top-level usage (the subcommand's unknown options are reported by the top-level
parser), and ``dmeo`` lists every subcommand without naming the close one (Python >= 3.14 adds
suggestions; earlier versions do not). :class:`SuggestingParser` reports the first unknown option
of the subcommand it was given to, with that subcommand's usage and the closest known option,
and adds the closest choice to an invalid-choice error (``difflib.get_close_matches``).

Subparsers made with ``add_subparsers()`` of a :class:`SuggestingParser` are of the same class
(argparse's default ``parser_class``), so the whole ``ascend-emu`` tree suggests.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import NoReturn

#: Exit status of a usage error (argparse's).
USAGE_ERROR = 2

_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def closest(word: str, candidates) -> str | None:
    """The candidate closest to ``word`` (``difflib`` ratio >= 0.6), or None."""
    found = difflib.get_close_matches(word, [str(c) for c in candidates], n=1, cutoff=0.6)
    return found[0] if found else None


class SuggestingParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose usage errors name the closest option or choice.

    Errors (exit status 2, on stderr, as argparse's): ``<prog>: error: unrecognized argument
    '--slott' (did you mean '--slot'?)`` with the usage of the subcommand that does not know the
    option, before any other error of the same command line; ``invalid choice: 'dmeo' (choose
    from ...); did you mean 'demo'?``.
    """

    _seen: list[str]

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._seen = [str(a) for a in (sys.argv[1:] if args is None else args)]
        return super().parse_known_args(args, namespace)

    # -- which parser a token belongs to -----------------------------------------------------
    def _subcommand(self) -> tuple[SuggestingParser, list[str]]:
        """The innermost subcommand parser named on the command line, and its own tokens."""
        parser, tokens = self, list(getattr(self, "_seen", []))
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if not subs:
                return parser, tokens
            chosen = next(((i, subs[0].choices[t]) for i, t in enumerate(tokens)
                           if t in subs[0].choices and not t.startswith("-")), None)
            if chosen is None or not isinstance(chosen[1], SuggestingParser):
                return parser, tokens
            parser, tokens = chosen[1], list(getattr(chosen[1], "_seen", tokens[chosen[0] + 1:]))

    def _own_tokens(self, tokens: list[str]) -> list[str]:
        """The option-like tokens of ``tokens`` that this parser parses: none after ``--``, none
        after the first positional of a parser whose last positional takes the rest (``run``)."""
        remainder = any(a.nargs == argparse.REMAINDER for a in self._actions)
        options, tokens = [], list(tokens)
        while tokens:
            t = tokens.pop(0)
            if t == "--":
                break
            if not t.startswith("-") or _NUMBER.match(t) or t == "-":
                if remainder:
                    break
                continue
            options.append(t)
            action = self._option_string_actions.get(t)
            if action is not None and action.nargs is None and action.option_strings and \
                    not isinstance(action, (argparse._StoreConstAction, argparse._CountAction)) and tokens:
                tokens.pop(0)  # its value
        return options

    def _known(self, option: str) -> bool:
        name = option.split("=", 1)[0]
        if name in self._option_string_actions:
            return True
        if not name.startswith("--") and len(name) > 2:  # -j4: a short option with its value
            return name[:2] in self._option_string_actions
        return self.allow_abbrev and name.startswith("--") and any(
            o.startswith(name) for o in self._option_string_actions if o.startswith("--"))

    def unknown_option(self) -> tuple[SuggestingParser, str] | None:
        """``(parser, token)``: the first option on the command line its subcommand does not know."""
        parser, tokens = self._subcommand()
        for token in parser._own_tokens(tokens):
            if not parser._known(token):
                return parser, token
        return None

    def error(self, message: str) -> NoReturn:
        unknown = self.unknown_option()
        if unknown is not None:
            parser, token = unknown
            name = token.split("=", 1)[0]
            near = closest(name, [o for o in parser._option_string_actions if o.startswith("--")]) \
                if name.startswith("--") else None
            parser.print_usage(sys.stderr)
            hint = f" (did you mean {near!r}?)" if near else f" (see {parser.prog} --help)"
            parser.exit(USAGE_ERROR, f"{parser.prog}: error: unrecognized argument {token!r}{hint}\n")
        match = re.search(r"invalid choice: '?([^' ]*)'?", message)
        if match:
            choices = [c for a in self._actions if a.choices for c in a.choices]
            near = closest(match.group(1), choices)
            if near is not None:
                message = f"{message}; did you mean {near!r}?"
        super().error(message)
