"""Flags as Kubernetes components take them: booleans with =true/=false, Go durations, environment
variables, and one-line errors with exit code 2 (controller/flags.py, the operator's controller/cli.py)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller import cli, flags
from controller.runtime.logs import teardown_logging


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15.0),
        ("2m", 120.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("1m0.5s", 60.5),
        (".5s", 0.5),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("100ns", 1e-7),
        ("0", 0.0),
        ("0s", 0.0),
        ("-2s", -2.0),
        ("+3m", 180.0),
        ("15", 15.0),
        ("2.5", 2.5),
        (" 10s ", 10.0),
    ],
)
def test_durations_in_go_syntax_or_seconds(text: str, seconds: float) -> None:
    assert flags.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "15x", "1h 30m", "m5", "1.2.3s", "abc", "1e3", "--5s", "5s3"])
def test_bad_durations_are_refused_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        flags.parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(15, "15s"), (120, "2m"), (5400, "1h30m"), (0.5, "500ms"), (0, "0s"), (90.5, "1m30.5s")],
)
def test_durations_are_shown_the_go_way(seconds: float, text: str) -> None:
    assert flags.format_duration(seconds) == text
    assert flags.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("word", ["1", "t", "T", "TRUE", "true", "True"])
def test_true_words(word: str) -> None:
    assert flags.parse_bool(word) is True


@pytest.mark.parametrize("word", ["0", "f", "F", "FALSE", "false", "False"])
def test_false_words(word: str) -> None:
    assert flags.parse_bool(word) is False


@pytest.mark.parametrize("word", ["yes", "no", "on", "", "2"])
def test_other_words_are_not_booleans(word: str) -> None:
    with pytest.raises(ValueError, match="use true or false"):
        flags.parse_bool(word)


def small_parser() -> flags.FlagParser:
    parser = flags.FlagParser(prog="tool")
    parser.add_flag("--switch", action=flags.BoolAction, default=True, env="TOOL_SWITCH", help="a switch")
    parser.add_flag(
        "--wait", type=flags.duration_type(positive=True), default=5.0, env="TOOL_WAIT", help="a wait"
    )
    parser.add_flag("--count", type=flags.int_type(1), default=1, help="a count")
    parser.add_argument("rest", nargs="*")
    return parser


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], True),
        (["--switch"], True),
        (["--switch=true"], True),
        (["--switch=false"], False),
        (["--switch=False"], False),
        (["--switch=0"], False),
        (["--no-switch"], False),
        (["--switch=false", "--switch"], True),
    ],
)
def test_a_boolean_takes_every_pflag_spelling(argv: list[str], expected: bool) -> None:
    assert small_parser().parse(argv, environ={}).switch is expected


def test_a_boolean_never_swallows_the_next_argument() -> None:
    parsed = small_parser().parse(["--switch", "false"], environ={})
    assert parsed.switch is True
    assert parsed.rest == ["false"]


def test_arguments_after_the_double_dash_are_left_alone() -> None:
    assert small_parser().parse(["--", "--switch=false"], environ={}).rest == ["--switch=false"]


def one_line_exit(
    parser: flags.FlagParser, argv: list[str], capsys: pytest.CaptureFixture[str], **env: str
) -> str:
    with pytest.raises(SystemExit) as exited:
        parser.parse(argv, environ=env)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    return captured.err.strip()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--switch=maybe"],
            "tool: argument --switch: invalid boolean 'maybe': use true or false (see --help)",
        ),
        (["--wait=soon"], "tool: argument --wait: invalid duration 'soon'"),
        (["--wait=0s"], "tool: argument --wait: invalid duration '0s': must be more than 0"),
        (["--count=0"], "tool: argument --count: invalid value '0': must be at least 1"),
        (["--count=many"], "tool: argument --count: invalid whole number 'many'"),
        (["--bogus"], "tool: unknown flag or argument: --bogus (see --help)"),
        (["--swi"], "tool: unknown flag or argument: --swi (see --help)"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_code_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert one_line_exit(small_parser(), argv, capsys).startswith(expected)


def test_flags_come_from_the_environment_and_the_command_line_wins() -> None:
    parser = small_parser()
    parsed = parser.parse([], environ={"TOOL_SWITCH": "false", "TOOL_WAIT": "1m"})
    assert (parsed.switch, parsed.wait) == (False, 60.0)
    parsed = small_parser().parse(
        ["--switch", "--wait=2s"], environ={"TOOL_SWITCH": "false", "TOOL_WAIT": "1m"}
    )
    assert (parsed.switch, parsed.wait) == (True, 2.0)
    assert small_parser().parse([], environ={"TOOL_WAIT": ""}).wait == 5.0


def test_a_bad_environment_value_names_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_exit(small_parser(), [], capsys, TOOL_WAIT="forever")
    assert line.startswith("tool: environment variable TOOL_WAIT (for --wait): invalid duration 'forever'")


def test_help_names_the_environment_variable_and_how_to_set_a_boolean() -> None:
    text = small_parser().format_help()
    assert "[env TOOL_SWITCH]" in text
    assert "[env TOOL_WAIT]" in text
    assert "--switch[=true|false]" in text
    assert "--no-switch" not in text


# -------------------------------------------------------------------------------- the operator's flags


def operator_flags(parser: flags.FlagParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.option_strings and a.help is not argparse.SUPPRESS and a.dest != "help"
    ]


def test_every_operator_flag_names_an_environment_variable_in_help() -> None:
    parser = cli.parser()
    text = " ".join(parser.format_help().split())
    for action in operator_flags(parser):
        names = [name for name, bound in parser.environment.items() if bound is action]
        assert len(names) == 1, action.option_strings
        assert f"[env {names[0]}]" in text
    assert len(operator_flags(parser)) == 26
    assert parser.environment["--kubeconfig".lstrip("-").upper()].dest == "kubeconfig"
    assert parser.environment["LOG_LEVEL"].dest == "log_level"
    assert parser.environment["TRAININGJOB_OPERATOR_LEADER_ELECT"].dest == "leader_elect"


def test_the_operators_booleans_and_durations() -> None:
    parser = cli.parser()
    assert parser.parse(["--leader-elect=false"], environ={}).leader_elect is False
    assert cli.parser().parse(["--leader-elect=false"], environ={}).leader_elect is False
    assert cli.parser().parse(["--leader-elect=true"], environ={}).leader_elect is True
    assert cli.parser().parse([], environ={}).leader_elect is True
    parsed = cli.parser().parse(
        [
            "--lease-duration=1m",
            "--renew-deadline=40s",
            "--retry-period=500ms",
            "--force-delete-after=1h30m",
            "--node-lost-after=45",
            "--progress-interval=0",
        ],
        environ={},
    )
    assert (parsed.lease_duration, parsed.renew_deadline, parsed.retry_period) == (60.0, 40.0, 0.5)
    assert (parsed.force_delete_after, parsed.node_lost_after, parsed.progress_interval) == (
        5400.0,
        45.0,
        0.0,
    )
    defaults = cli.parser().parse([], environ={})
    assert (defaults.lease_duration, defaults.renew_deadline, defaults.retry_period) == (15.0, 10.0, 2.0)
    assert (defaults.force_delete_after, defaults.node_lost_after, defaults.progress_interval) == (
        60.0,
        30.0,
        5.0,
    )


def test_the_operators_flags_from_the_environment() -> None:
    parsed = cli.parser().parse(
        ["--workers=2"],
        environ={
            "TRAININGJOB_OPERATOR_LEADER_ELECT": "false",
            "TRAININGJOB_OPERATOR_WORKERS": "9",
            "TRAININGJOB_OPERATOR_NODE_LOST_AFTER": "2m",
            "TRAININGJOB_OPERATOR_METRICS_BIND_ADDRESS": "127.0.0.1:9999",
            "TRAININGJOB_OPERATOR_METRICS_SECURE": "false",
            "TRAININGJOB_OPERATOR_HEALTH_PROBE_BIND_ADDRESS": "0",
            "KUBECONFIG": "/some/kubeconfig",
            "LOG_LEVEL": "debug",
        },
    )
    assert parsed.leader_elect is False
    assert parsed.workers == 2  # the command line wins
    assert parsed.node_lost_after == 120.0
    assert parsed.metrics_bind_address == "127.0.0.1:9999"
    assert parsed.metrics_secure is False
    assert parsed.health_probe_bind_address == "0"
    assert parsed.kubeconfig == "/some/kubeconfig"
    assert parsed.log_level == "debug"


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["--leader-elect=nope"], {}, "argument --leader-elect: invalid boolean 'nope'"),
        (
            ["--lease-duration=15"],
            {"TRAININGJOB_OPERATOR_RENEW_DEADLINE": "20s"},
            "--lease-duration (15s) must be longer than --renew-deadline (20s)",
        ),
        (["--renew-deadline=2s"], {}, "--renew-deadline (2s) must be longer than 1.2 x --retry-period (2s)"),
        (
            ["--metrics-bind-address=8443"],
            {},
            "argument --metrics-bind-address: invalid listen address '8443'",
        ),
        (["--metrics-addr=8080"], {}, "argument --metrics-addr: invalid listen address '8080'"),
        (
            ["--metrics-secure=false", "--metrics-cert-path=/certs"],
            {},
            "--metrics-cert-path needs --metrics-secure: plain HTTP serves no certificate",
        ),
        (
            ["--metrics-addr=127.0.0.1:8080", "--metrics-bind-address=127.0.0.1:8443"],
            {},
            "--metrics-addr=127.0.0.1:8080 and --metrics-bind-address=127.0.0.1:8443 disagree",
        ),
        (
            [],
            {"TRAININGJOB_OPERATOR_HEALTH_PROBE_BIND_ADDRESS": ":8443"},
            "--metrics-bind-address and --health-probe-bind-address are both :8443",
        ),
        (["--workers=0"], {}, "argument --workers: invalid value '0': must be at least 1"),
        (["--qps=-1"], {}, "argument --qps: invalid value '-1': must be at least 0"),
        (["--log-level=loud"], {}, "argument --log-level: invalid log level 'loud'"),
        (
            [],
            {"LOG_LEVEL": "loud"},
            "environment variable LOG_LEVEL (for --log-level): invalid log level 'loud'",
        ),
        (
            ["--progress-interval=-1s"],
            {},
            "argument --progress-interval: invalid duration '-1s': must be at least 0s",
        ),
        (["--leader-elec"], {}, "unknown flag or argument: --leader-elec"),
    ],
)
def test_a_bad_operator_flag_is_one_line_and_exit_code_2(
    argv: list[str],
    env: dict[str, str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [*cli.parser().environment, "LOG_LEVEL", "KUBECONFIG"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("trainingjob-operator: ")
    assert expected in err


@pytest.fixture
def json_logs_removed_afterwards() -> Iterator[None]:
    """cli.main installs the JSON log handler on the captured stderr; later tests must not write to it."""
    try:
        yield
    finally:
        teardown_logging()


@pytest.mark.usefixtures("json_logs_removed_afterwards")
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read kubeconfig {path}: No such file or directory"),
        ("::: not yaml", "cannot use kubeconfig {path}: "),
        ("apiVersion: v1\nkind: Config\n", "cannot use kubeconfig {path}: "),
    ],
)
def test_an_unusable_kubeconfig_is_one_line_and_exit_code_2(
    content: str | None, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    code = cli.main([f"--kubeconfig={path}", *LOOPBACK_PORTS])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("trainingjob-operator: " + expected.format(path=path)), err


LOOPBACK_PORTS = ("--metrics-bind-address=127.0.0.1:0", "--health-probe-bind-address=127.0.0.1:0")


def test_the_deprecated_metrics_addr_sets_the_metrics_bind_address() -> None:
    parser = cli.parser()
    args = parser.parse(["--metrics-addr=127.0.0.1:8080"], environ={})
    assert cli.follow_deprecated_flags(args) is None
    assert args.metrics_bind_address == "127.0.0.1:8080"
    assert args.metrics_secure is True, "the alias moves the address only"
    args = parser.parse([], environ={"TRAININGJOB_OPERATOR_METRICS_ADDR": ":9090"})
    assert cli.follow_deprecated_flags(args) is None
    assert args.metrics_bind_address == ":9090"
    same = parser.parse(["--metrics-addr=:9090", "--metrics-bind-address=:9090"], environ={})
    assert cli.follow_deprecated_flags(same) is None
    assert "--metrics-addr" not in parser.format_help()


@pytest.mark.usefixtures("json_logs_removed_afterwards")
def test_the_deprecated_metrics_addr_is_one_warning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    path = tmp_path / "kubeconfig"
    code = cli.main([f"--kubeconfig={path}", "--metrics-addr=127.0.0.1:0", "--health-probe-bind-address=0"])
    assert code == 2
    warning, error = capsys.readouterr().err.splitlines()
    entry = json.loads(warning)
    assert (entry["level"], entry["message"]) == ("WARNING", cli.DEPRECATION_WARNING)
    assert error.startswith(f"trainingjob-operator: cannot read kubeconfig {path}")


def test_the_readme_lists_every_operator_flag() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    parser = cli.parser()
    for action in operator_flags(parser):
        assert f"`{action.option_strings[0]}`" in readme, action.option_strings[0]
