"""Command-line flags that behave like every other Kubernetes component's (Go's pflag), on argparse.

Platform teams script the operator the way they script kube-controller-manager: `--leader-elect=false`,
`--lease-duration=15s`, a flag set through the environment of a Deployment, and a refused flag that
ends the process with one line and exit code 2. argparse alone refuses `--flag=false` for a switch,
knows no Go durations, reads no environment and prints its usage before the error. This module adds
those pieces as pure parsing functions and one small parser class; the commands (controller/cli.py,
the kubectl plugin) declare their flags with them.

Precedence, as in controller-runtime based components: the command line, then the flag's environment
variable, then the default.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NoReturn, TypeVar

# Go's strconv.ParseBool, which pflag uses for boolean flags.
TRUE_WORDS: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
FALSE_WORDS: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})

# Go's time.ParseDuration units, in seconds.
DURATION_UNITS: Final[Mapping[str, float]] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART: Final = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_PLAIN_NUMBER: Final = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")
N = TypeVar("N", int, float)
DURATION_EXAMPLES: Final = "e.g. 15s, 2m, 1h30m, 500ms, or a number of seconds"


def parse_bool(text: str) -> bool:
    """true/false the way Go's strconv.ParseBool reads them (1, t, TRUE, true, True, 0, f, ...)."""
    value = text.strip()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"invalid boolean {text!r}: use true or false")


def parse_duration(text: str) -> float:
    """Seconds from a Go duration ("1h30m", "500ms", "-2s", "0") or a plain number of seconds ("2.5")."""
    value = text.strip()
    if _PLAIN_NUMBER.fullmatch(value):
        return float(value)
    sign = 1.0
    if value and value[0] in "+-":
        sign = -1.0 if value[0] == "-" else 1.0
        value = value[1:]
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(value):
        if match.start() != position:
            break
        total += float(match.group(1)) * DURATION_UNITS[match.group(2)]
        position = match.end()
    if not value or position != len(value):
        raise ValueError(f"invalid duration {text!r}: {DURATION_EXAMPLES}")
    if not math.isfinite(total):
        raise ValueError(f"invalid duration {text!r}: too large")
    return sign * total


def format_duration(seconds: float) -> str:
    """The shortest Go-style spelling of `seconds` for help texts: 15s, 2m, 1h30m, 500ms."""
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{int(hours)}h" if hours else "",
        f"{int(minutes)}m" if minutes else "",
        f"{secs:g}s" if secs else "",
    ]
    return "".join(parts)


# ---------------------------------------------------------------------------------- argparse types


def duration_type(minimum: float = 0.0, *, positive: bool = False) -> Callable[[str], float]:
    """An argparse `type` for a duration flag: Go syntax or seconds, at least `minimum` (or > 0)."""

    def parse(text: str) -> float:
        try:
            seconds = parse_duration(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        if positive and seconds <= 0:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be more than 0")
        if seconds < minimum:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be at least {minimum:g}s")
        return seconds

    parse.__name__ = "duration"
    return parse


def int_type(minimum: int) -> Callable[[str], int]:
    """An argparse `type` for a whole number of at least `minimum`."""
    return _number_type(int, minimum, "whole number")


def float_type(minimum: float) -> Callable[[str], float]:
    """An argparse `type` for a (finite) number of at least `minimum`."""
    return _number_type(float, minimum, "number")


def _number_type(convert: Callable[[str], N], minimum: N, word: str) -> Callable[[str], N]:
    def parse(text: str) -> N:
        try:
            value = convert(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {word} {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be at least {minimum:g}")
        return value

    parse.__name__ = word.replace(" ", "_")
    return parse


def checked(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """An argparse `type` from a function that raises ValueError with a message naming the problem."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = name
    return convert


class BoolAction(argparse.Action):
    """A boolean flag as pflag has them: `--flag` is true, `--flag=true` and `--flag=false` say which.

    Like pflag, the value is only ever taken after "=", so a switch never swallows the next argument.
    FlagParser rewrites `--flag=false` into the flag's hidden negation `--no-flag` before argparse sees
    it; `--no-flag` itself, the operator's earlier spelling, keeps working and is not shown in --help.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("default", False)
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.negation: str | None = None

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, True)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows a boolean flag as `--flag[=true|false]`, the way to give it a value."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, BoolAction):
            return ", ".join(action.option_strings) + "[=true|false]"
        return super()._format_action_invocation(action)


class FlagParser(argparse.ArgumentParser):
    """argparse with pflag's habits: one-line errors (exit code 2), `--flag=false` for booleans, no
    abbreviated flags, and flags that may come from environment variables.

    `add_flag(..., env="NAME")` records the variable and names it in --help; `parse(argv, environ)`
    reads the variables (checked with the flag's own type, errors naming the variable) before the
    command line, which wins.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.environment: dict[str, argparse.Action] = {}

    def add_flag(self, *names: str, env: str | None = None, **kwargs: Any) -> argparse.Action:
        help_text = kwargs.get("help")
        if env and help_text is not None and help_text is not argparse.SUPPRESS:
            kwargs["help"] = f"{help_text} [env {env}]"
        action = self.add_argument(*names, **kwargs)
        if isinstance(action, BoolAction):
            long_names = [name for name in names if name.startswith("--")]
            if long_names:
                action.negation = f"--no-{long_names[0][2:]}"
                self.add_argument(
                    action.negation, dest=action.dest, action="store_false", help=argparse.SUPPRESS
                )
        if env:
            self.environment[env] = action
        return action

    def error(self, message: str) -> NoReturn:
        message = re.sub(r"^unrecognized arguments: ", "unknown flag or argument: ", message)
        self.exit(2, f"{self.prog}: {message} (see --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        return super().parse_known_args(self._booleans_spelled_out(args), namespace)

    def _booleans_spelled_out(self, args: Sequence[str] | None) -> list[str]:
        """`--flag=true` becomes `--flag`, `--flag=false` the hidden `--no-flag`; a bad value is an error."""
        given = list(sys.argv[1:] if args is None else args)
        rewritten: list[str] = []
        for index, arg in enumerate(given):
            if arg == "--":
                return rewritten + given[index:]
            flag, equals, value = arg.partition("=")
            action = self._option_string_actions.get(flag) if arg.startswith("--") and equals else None
            if not isinstance(action, BoolAction):
                rewritten.append(arg)
                continue
            try:
                truth = parse_bool(value)
            except ValueError as error:
                self.error(f"argument {flag}: {error}")
            if not truth and action.negation is None:
                self.error(f"argument {flag}: cannot be set to false")
            rewritten.append(flag if truth else str(action.negation))
        return rewritten

    def parse(self, argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Any:
        """parse_args with the environment applied first; exits 2 with one line on a bad value."""
        environ = os.environ if environ is None else environ
        defaults: dict[str, Any] = {}
        for name, action in self.environment.items():
            raw = environ.get(name)
            if raw is None or raw == "":
                continue
            defaults[action.dest] = self._environment_value(name, action, raw)
        self.set_defaults(**defaults)
        return self.parse_args(sys.argv[1:] if argv is None else list(argv))

    def _environment_value(self, name: str, action: argparse.Action, raw: str) -> Any:
        convert: Callable[[str], Any] | None = parse_bool if isinstance(action, BoolAction) else action.type  # type: ignore[assignment]
        if convert is None:
            return raw
        try:
            return convert(raw)
        except (argparse.ArgumentTypeError, ValueError) as error:
            self.error(f"environment variable {name} (for {action.option_strings[0]}): {error}")


def environment_name(prefix: str, flag: str) -> str:
    """TRAININGJOB_OPERATOR_LEADER_ELECT for prefix TRAININGJOB_OPERATOR_ and --leader-elect."""
    return prefix + flag.lstrip("-").replace("-", "_").upper()
