"""`kubectl trainingjob ...`: the kubectl plugin (console script `kubectl-trainingjob`) on the client.

kubectl runs any `kubectl-<name>` on PATH as `kubectl <name>`, passing the arguments after the
plugin's name and its own environment (so $KUBECONFIG). The plugin therefore takes kubectl's
`-n/--namespace`, `--kubeconfig` and `--context` itself, before or after the command.

Exit codes, for scripts:
  0  success; for `watch`, the job Completed; for `tensorboard`, stopped by Ctrl-C or SIGTERM
  1  `watch`: the job Failed
  2  an error: bad flags, no such job, cluster unreachable, log unavailable, refused request
  3  `watch --timeout`: the job had not finished in time
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Final, TextIO

from controller import flags
from trainingjob_client.client import TrainingJobClient
from trainingjob_client.describe import describe
from trainingjob_client.errors import TrainingJobError, WaitTimeout
from trainingjob_client.following import format_seconds
from trainingjob_client.progressbar import ProgressBar
from trainingjob_client.tensorboard import PORT as TENSORBOARD_PORT
from trainingjob_client.viewer import options_from, view
from trainingjob_client.views import TrainingJob

PROG: Final = "kubectl trainingjob"
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_ERROR: Final = 2
EXIT_TIMEOUT: Final = 3
EXIT_INTERRUPTED: Final = 130

EPILOG = """\
exit codes: 0 success (watch: the job Completed; tensorboard: stopped by Ctrl-C), 1 watch: the job
Failed, 2 error (bad flags, no such job, cluster unreachable, log unavailable, no viewable TensorBoard
logs, port in use), 3 watch --timeout expired, 130 interrupted.

examples:
  kubectl trainingjob watch mnist -n team-a
  kubectl trainingjob logs mnist --rank 1 -f
  kubectl trainingjob describe mnist
  kubectl trainingjob tensorboard mnist --port 6007
  kubectl trainingjob suspend mnist && kubectl trainingjob resume mnist"""


def _connection_flags() -> flags.FlagParser:
    """-n, --kubeconfig and --context, accepted before and after the command (kubectl's habit)."""
    common = flags.FlagParser(add_help=False)
    common.add_flag(
        "-n", "--namespace", default=argparse.SUPPRESS, help="the job's namespace (default: the context's)"
    )
    common.add_flag(
        "--kubeconfig",
        default=argparse.SUPPRESS,
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)",
    )
    common.add_flag(
        "--context", default=argparse.SUPPRESS, help="kubeconfig context (default: the current one)"
    )
    return common


def parser() -> flags.FlagParser:
    common = _connection_flags()
    main = flags.FlagParser(
        prog=PROG,
        description="Watch, read and control TrainingJobs (ml.example.com/v1).",
        epilog=EPILOG,
        parents=[common],
    )
    commands = main.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help_text: str) -> flags.FlagParser:
        sub: flags.FlagParser = commands.add_parser(
            name, help=help_text, description=help_text, parents=[common], epilog=EPILOG
        )
        sub.add_argument("name", metavar="NAME", help="the TrainingJob")
        return sub

    watch = command("watch", "show a live progress bar, state and restarts until the job finishes")
    watch.add_flag(
        "--timeout",
        type=flags.duration_type(positive=True),
        default=None,
        metavar="DURATION",
        help="give up after this long, exit code 3 (e.g. 30m; default: wait until the job finishes)",
    )
    logs = command("logs", "print a rank's trainer log (through the API server, like kubectl logs)")
    logs.add_flag(
        "--rank", type=flags.int_type(0), default=0, help="the rank (replica index) to read (default 0)"
    )
    logs.add_flag(
        "-f",
        "--follow",
        action=flags.BoolAction,
        default=False,
        help="stream the log until the container ends",
    )
    logs.add_flag("--tail", type=flags.int_type(0), default=None, help="only the last N lines")
    command("describe", "the job, why it is not running, a row per rank, its conditions and Events")
    tensorboard_viewer = command(
        "tensorboard",
        "run TensorBoard in the cluster on the job's log directory and port-forward to it until Ctrl-C",
    )
    tensorboard_viewer.add_flag(
        "--port",
        type=flags.checked(local_port, "port"),
        default=TENSORBOARD_PORT,
        help=f"the local port on 127.0.0.1 (default {TENSORBOARD_PORT}; 0 picks a free one)",
    )
    tensorboard_viewer.add_flag(
        "--image",
        default=None,
        help="the image that runs TensorBoard (default: the job's own, which wrote the event files)",
    )
    tensorboard_viewer.add_flag(
        "--keep",
        action=flags.BoolAction,
        default=False,
        help="leave the viewer pod running on exit (default: delete it)",
    )
    tensorboard_viewer.add_flag(
        "--timeout",
        type=flags.duration_type(positive=True),
        default=300.0,
        metavar="DURATION",
        help="how long the viewer pod may take to be ready (default 5m)",
    )
    command("suspend", "set spec.suspend=true: the operator deletes the pods and stops the deadline clock")
    command("resume", "set spec.suspend=false: the gang starts again from its latest checkpoint")
    return main


def local_port(text: str) -> int:
    port = int(text.strip())
    if not 0 <= port <= 65535:
        raise ValueError(f"invalid port {text!r}: must be 0 to 65535")
    return port


# --------------------------------------------------------------------------------------- commands


def watch(client: TrainingJobClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """A progress bar on a terminal; elsewhere (a script, a CI log) one line per change."""
    stream = client.watch(args.name, timeout=args.timeout)
    bar = ProgressBar(f"{stream.namespace}/{stream.name}", file=err) if err.isatty() else None

    def say(line: str) -> None:
        if bar is not None:
            bar.write(line)
        else:
            print(line, file=err, flush=True)

    shown_state: str | None = None
    shown_restarts = 0
    try:
        for job in stream:
            status = job.status
            if bar is not None:
                bar.update(job)
            else:
                say(f"{job.namespace}/{job.name}  {job.summary()}")
            if status.state != shown_state:
                shown_state = status.state
                say(f"{status.state or 'no status yet'}: {status.message}".rstrip(": "))
            if status.restart_count > shown_restarts:
                shown_restarts = status.restart_count
                say(f"restart {status.restart_count}: {status.last_restart_reason or 'unknown reason'}")
    finally:
        if bar is not None:
            bar.close()
    final = stream.last
    print(outcome(final), file=out, flush=True)
    return EXIT_OK if final.state == "Completed" else EXIT_FAILED


def outcome(job: TrainingJob) -> str:
    status = job.status
    text = f"TrainingJob {job.namespace}/{job.name} {status.state}"
    if status.duration:
        text += f" after {status.duration}"
    if status.restart_count:
        text += f", {status.restart_count} restarts"
    if status.state == "Failed":
        text += "".join(f": {part}" for part in (status.failure_reason, status.message) if part)
    return text


def logs(client: TrainingJobClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.follow:
        for line in client.logs(args.name, args.rank, follow=True, tail_lines=args.tail):
            print(line, file=out, flush=True)
        return EXIT_OK
    text = client.logs(args.name, args.rank, tail_lines=args.tail)
    out.write(text)
    out.flush()
    return EXIT_OK


def describe_command(client: TrainingJobClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    job = client.get(args.name)
    text = describe(job, client.ranks(args.name), client.events(args.name))
    print(text, file=out, flush=True)
    return EXIT_OK


def suspend(client: TrainingJobClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    job = client.suspend(args.name)
    print(f"trainingjob.ml.example.com/{job.name} suspended", file=out, flush=True)
    return EXIT_OK


def resume(client: TrainingJobClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    job = client.resume(args.name)
    print(f"trainingjob.ml.example.com/{job.name} resumed", file=out, flush=True)
    return EXIT_OK


def tensorboard_command(client: TrainingJobClient, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    return view(client, args.name, options_from(vars(args)), out, err)


Command = Callable[[TrainingJobClient, argparse.Namespace, TextIO, TextIO], int]
COMMANDS: Final[dict[str, Command]] = {
    "watch": watch,
    "logs": logs,
    "describe": describe_command,
    "suspend": suspend,
    "resume": resume,
    "tensorboard": tensorboard_command,
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = parser().parse(argv)  # a bad flag: one line, exit code 2
    try:
        client = TrainingJobClient(
            getattr(args, "namespace", None),
            kubeconfig=getattr(args, "kubeconfig", None),
            context=getattr(args, "context", None),
        )
        return COMMANDS[args.command](client, args, out, err)
    except WaitTimeout as error:
        print(f"{PROG}: {error}", file=err, flush=True)
        return EXIT_TIMEOUT
    except (TrainingJobError, ValueError) as error:
        print(f"{PROG}: {error}", file=err, flush=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=err, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `kubectl trainingjob logs job | head`: the reader has all it wanted.
        return EXIT_OK


__all__ = ["EXIT_ERROR", "EXIT_FAILED", "EXIT_OK", "EXIT_TIMEOUT", "format_seconds", "main", "parser"]
