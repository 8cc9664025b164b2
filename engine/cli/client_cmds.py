"""Client commands: ``start``, ``raise``, ``signal-with-start``, ``terminate``, ``cancel``,
``suspend``, ``resume``, ``retry``, ``purge``, ``status``, ``list`` and ``wait`` - the Python
client from a shell.

Every command waits for the processor's answer (``--no-wait`` skips it) and prints it; a
refusal exits 4 with the reason (``main``), no answer within ``--timeout`` exits 124.
Exit codes of ``wait`` and ``start --wait``: 0 when the instance COMPLETED, 1 when it FAILED,
was TERMINATED or CANCELLED, or TIMED_OUT, 124 when the wait timed out (like ``timeout(1)``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from engine.cli import SubParsers
from engine.cli.answers import add_answer_flags, answering_client, not_negative, print_answer
from engine.cli.audit_io import Progress
from engine.cli.options import (
    add_command,
    add_tag_filter,
    connected_settings,
    iso_time,
    json_value,
    tag_pair,
)
from engine.client import Client, InstanceState
from engine.core.errors import InstanceNotFoundError, WaitTimeoutError
from engine.core.history import RuntimeStatus
from engine.core.messages import IdReusePolicy
from engine.services.client.listing import DEFAULT_PAGE, MAX_PAGE

__all__ = ["register"]

EXIT_FAILED = 1
EXIT_TIMEOUT = 124
VERSION_HELP = (
    "workflow version (default: the workflow's default version, docs/how-to/change-code.md)"
)


def register(subparsers: SubParsers) -> None:
    """Add the client commands."""
    _register_start(subparsers)
    _register_raise(subparsers)
    _register_simple(subparsers)
    _register_query(subparsers)
    _register_update(subparsers)
    _register_status(subparsers)
    _register_list(subparsers)
    _register_wait(subparsers)


# --- argument types -------------------------------------------------------------------------


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _add_wait_flags(parser: argparse.ArgumentParser, timeout: float) -> None:
    parser.add_argument(
        "--timeout", type=not_negative, default=timeout, help=f"seconds to wait ({timeout:g})"
    )
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def _positive_seconds(text: str) -> float:
    value = not_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def _add_workflow_timeout_flags(parser: argparse.ArgumentParser) -> None:
    """The per-start workflow timeouts of the run a command begins (``Client.start``)."""
    parser.add_argument(
        "--execution-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="the whole chain of runs ends TIMED_OUT after this long (default: the workflow's)",
    )
    parser.add_argument(
        "--run-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="each run ends TIMED_OUT after this long (default: the workflow's)",
    )


# --- start ---------------------------------------------------------------------------------


def _register_start(subparsers: SubParsers) -> None:
    start = add_command(subparsers, "start", "start a workflow instance, print its id", _start)
    start.add_argument("workflow", metavar="NAME", help="registered workflow name")
    start.add_argument("--input", type=json_value, help="workflow input as JSON")
    start.add_argument("--id", dest="instance_id", help="instance id (default: a new UUID)")
    start.add_argument(
        "--reuse-policy",
        type=str.upper,
        choices=[p.value for p in IdReusePolicy],
        default=IdReusePolicy.ERROR_IF_RUNNING.value,
        help="what to do if the id is taken (default ERROR_IF_RUNNING)",
    )
    start.add_argument(
        "--version",
        default="",
        help=VERSION_HELP,
    )
    start.add_argument("--start-at", type=iso_time, help="ISO 8601 time to start at (scheduled)")
    start.add_argument(
        "--concurrency-key",
        default="",
        help="count the start against the workflow's max_concurrency_per_key for this key "
        "(over the limit it waits as PENDING for a slot)",
    )
    start.add_argument(
        "--tag", type=tag_pair, action="append", default=[], help="KEY=VALUE tag (repeatable)"
    )
    _add_workflow_timeout_flags(start)
    start.add_argument("--wait", action="store_true", help="wait for completion, print status")
    start.add_argument(
        "--request-id", help="makes a retry safe: the same id starts once (default: new)"
    )
    start.add_argument(
        "--no-wait",
        dest="wait_answer",
        action="store_false",
        help="do not wait for the processor's answer (bulk scripts)",
    )
    _add_wait_flags(start, 60.0)


def _start(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    settings = connected_settings(args, within_s=args.timeout if args.wait else None)
    timeout = args.timeout if args.wait_answer else None
    with Client.from_settings(settings, read_status=args.wait, timeout=timeout or 30.0) as client:
        instance_id = client.start(
            args.workflow,
            args.input,
            instance_id=args.instance_id,
            reuse_policy=IdReusePolicy(args.reuse_policy),
            request_id=args.request_id,
            start_at=args.start_at,
            tags=dict(args.tag),
            version=args.version,
            concurrency_key=args.concurrency_key,
            execution_timeout=args.execution_timeout,
            run_timeout=args.run_timeout,
            wait=args.wait_answer,
        )
        if not args.wait:
            print(instance_id)
            return 0
        if not args.json:
            print(instance_id, flush=True)
        return _await(client, instance_id, args, deadline)


# --- raise, terminate, suspend, resume, purge ---------------------------------------------


def _register_raise(subparsers: SubParsers) -> None:
    parser = add_command(subparsers, "raise", "raise an external event on an instance", _raise)
    parser.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    parser.add_argument("event", metavar="EVENT", help="event name the workflow waits for")
    parser.add_argument("--data", type=json_value, help="event payload as JSON")
    add_answer_flags(parser)
    both = add_command(
        subparsers,
        "signal-with-start",
        "raise an event on an instance, starting it first unless it is running (atomically)",
        _signal_with_start,
    )
    both.add_argument("workflow", metavar="NAME", help="registered workflow name")
    both.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    both.add_argument("event", metavar="EVENT", help="event name the workflow waits for")
    both.add_argument("--data", type=json_value, help="event payload as JSON")
    both.add_argument("--input", type=json_value, help="workflow input as JSON, if it starts")
    both.add_argument(
        "--version",
        default="",
        help=VERSION_HELP,
    )
    both.add_argument(
        "--tag", type=tag_pair, action="append", default=[], help="KEY=VALUE tag (repeatable)"
    )
    both.add_argument(
        "--reuse-policy",
        type=str.upper,
        choices=[p.value for p in IdReusePolicy],
        default=IdReusePolicy.IGNORE_IF_RUNNING.value,
        help="what the start does to an existing instance (default IGNORE_IF_RUNNING: a live "
        "one just gets the event, an ended one a new run; ERROR_IF_RUNNING refuses a live "
        "one, TERMINATE_IF_RUNNING replaces it, REJECT_DUPLICATE refuses an ended one)",
    )
    _add_workflow_timeout_flags(both)
    add_answer_flags(both)


def _raise(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        answer = client.raise_event(
            args.instance_id,
            args.event,
            args.data,
            request_id=args.request_id,
            wait=args.wait_answer,
        )
    return print_answer(answer)


def _signal_with_start(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        handle = client.signal_with_start(
            args.workflow,
            args.instance_id,
            args.event,
            args.data,
            input=args.input,
            version=args.version,
            tags=dict(args.tag),
            request_id=args.request_id,
            wait=args.wait_answer,
            reuse_policy=IdReusePolicy(args.reuse_policy),
            execution_timeout=args.execution_timeout,
            run_timeout=args.run_timeout,
        )
    return print_answer(handle.outcome)


def _register_query(subparsers: SubParsers) -> None:
    parser = add_command(
        subparsers,
        "query",
        "ask a workflow's query handler for a value (read-only; prints it as JSON)",
        _query,
    )
    parser.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    parser.add_argument("name", metavar="NAME", help="query name (ctx.set_query_handler)")
    parser.add_argument(
        "--arg",
        dest="query_args",
        metavar="JSON",
        type=json_value,
        action="append",
        default=[],
        help="one argument of the handler as JSON (repeatable, in order)",
    )
    parser.add_argument(
        "--timeout",
        type=not_negative,
        default=30.0,
        help="seconds to wait for the answer (30)",
    )


def _query(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        value = client.query(args.instance_id, args.name, *args.query_args, timeout=args.timeout)
    print(json.dumps(value))
    return 0


def _register_update(subparsers: SubParsers) -> None:
    parser = add_command(
        subparsers,
        "update",
        "run a workflow's update handler and print what it returns as JSON (recorded in "
        "its history; a rejection records nothing)",
        _update,
    )
    parser.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    parser.add_argument("name", metavar="NAME", help="update name (ctx.set_update_handler)")
    parser.add_argument(
        "--arg", dest="update_arg", metavar="JSON", type=json_value, help="the argument as JSON"
    )
    parser.add_argument(
        "--update-id",
        default=None,
        help="the update id (default: a new one); sending again with it gets the first answer",
    )
    parser.add_argument(
        "--timeout",
        type=not_negative,
        default=30.0,
        help="seconds to wait for the answer (30); the update may still finish later",
    )


def _update(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        value = client.update(
            args.instance_id,
            args.name,
            args.update_arg,
            update_id=args.update_id,
            timeout=args.timeout,
        )
    print(json.dumps(value))
    return 0


def _register_simple(subparsers: SubParsers) -> None:
    terminate = add_command(subparsers, "terminate", "terminate a running instance", _terminate)
    terminate.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    terminate.add_argument("--reason", default="", help="recorded in the instance's history")
    terminate.add_argument(
        "--recursive", action="store_true", help="also terminate its child workflows"
    )
    add_answer_flags(terminate)
    cancel = add_command(
        subparsers,
        "cancel",
        "ask a running instance to cancel: its code gets CancelledError and may clean up",
        _cancel,
    )
    cancel.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    cancel.add_argument("--reason", default="", help="recorded in the instance's history")
    add_answer_flags(cancel)
    for name, help in (
        ("suspend", "suspend an instance (events keep arriving, applied on resume)"),
        ("resume", "resume a suspended instance"),
    ):
        parser = add_command(subparsers, name, help, _suspend_or_resume)
        parser.add_argument("instance_id", metavar="INSTANCE", help="instance id")
        parser.add_argument("--reason", default="", help="recorded in the instance's history")
        parser.set_defaults(operation=name)
        add_answer_flags(parser)
    purge = add_command(subparsers, "purge", "delete a completed instance's state", _purge)
    purge.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    add_answer_flags(purge)
    retry = add_command(
        subparsers,
        "retry",
        "run a parked instance (its workflow code raised) again now, with the deployed code",
        _retry,
    )
    retry.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    add_answer_flags(retry)


def _terminate(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        answer = client.terminate(
            args.instance_id,
            args.reason,
            args.recursive,
            request_id=args.request_id,
            wait=args.wait_answer,
        )
    return print_answer(answer)


def _cancel(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        answer = client.cancel(
            args.instance_id, args.reason, request_id=args.request_id, wait=args.wait_answer
        )
    return print_answer(answer)


def _suspend_or_resume(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        send = client.suspend if args.operation == "suspend" else client.resume
        answer = send(
            args.instance_id, args.reason, request_id=args.request_id, wait=args.wait_answer
        )
    return print_answer(answer)


def _retry(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        answer = client.retry(args.instance_id, request_id=args.request_id, wait=args.wait_answer)
    return print_answer(answer)


def _purge(args: argparse.Namespace) -> int:
    with answering_client(args) as client:
        answer = client.purge(args.instance_id, request_id=args.request_id, wait=args.wait_answer)
    return print_answer(answer)


# --- status and wait -------------------------------------------------------------------------


def _register_status(subparsers: SubParsers) -> None:
    parser = add_command(subparsers, "status", "show an instance's status", _status)
    parser.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def _status(args: argparse.Namespace) -> int:
    with Client.from_settings(connected_settings(args)) as client:
        state = client.get(args.instance_id)
    if state is None:
        raise InstanceNotFoundError(
            f"no instance {args.instance_id!r} in namespace {client.settings.namespace!r}; "
            f"check the id and --namespace (a purged instance is gone for good)"
        )
    _print_state(state, args.json)
    return 0


def _register_list(subparsers: SubParsers) -> None:
    parser = add_command(
        subparsers,
        "list",
        "list instances by status, name, version, tags and creation time, newest first, "
        "a page at a time",
        _list,
    )
    parser.add_argument(
        "--status",
        type=str.upper,
        action="append",
        choices=[s.value for s in RuntimeStatus],
        help="only instances in this status (repeatable: any of them)",
    )
    parser.add_argument("--name", help="only instances of this workflow")
    parser.add_argument("--version", help="only instances running this workflow version")
    add_tag_filter(parser)
    parser.add_argument("--since", type=iso_time, help="only instances created at or after (ISO)")
    parser.add_argument(
        "--limit", type=_page_size, default=DEFAULT_PAGE, help=f"page size ({DEFAULT_PAGE})"
    )
    parser.add_argument(
        "--page-token",
        metavar="TOKEN",
        help="start after the previous page (the token it printed on stderr)",
    )
    parser.add_argument("--json", action="store_true", help="print the instances as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _page_size(text: str) -> int:
    value = _count(text)
    if value > MAX_PAGE:
        raise argparse.ArgumentTypeError(f"at most {MAX_PAGE} a page, got {value}; page on")
    return value


def _list(args: argparse.Namespace) -> int:
    """One page, read with bounded memory (the client reads no live view here)."""
    statuses = [RuntimeStatus(s) for s in args.status] if args.status else None
    with Client.from_settings(connected_settings(args), read_status=False) as client:
        page = client.list_page(
            status=statuses,
            name=args.name,
            version=args.version,
            tags=dict(args.tag),
            created_after=args.since,
            limit=args.limit,
            page_token=args.page_token,
            on_progress=Progress(not args.quiet),
        )
    if args.json:
        print(json.dumps([state.to_dict() for state in page.items], indent=2, sort_keys=True))
    for state in [] if args.json else page.items:
        created = state.created.isoformat(timespec="seconds")
        tags = " ".join(f"{k}={v}" for k, v in sorted(state.tags.items()))
        print(
            f"{state.instance_id}  {state.name}  {state.status.value}  {created}  {tags}".rstrip()
        )
    if page.next_page_token is not None:
        print(f"next page: --page-token {page.next_page_token}", file=sys.stderr)
    return 0


def _register_wait(subparsers: SubParsers) -> None:
    parser = add_command(subparsers, "wait", "wait until an instance ends, print its status", _wait)
    parser.add_argument("instance_id", metavar="INSTANCE", help="instance id")
    _add_wait_flags(parser, 60.0)


def _wait(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    settings = connected_settings(args, within_s=args.timeout)
    with Client.from_settings(settings, timeout=args.timeout) as client:
        return _await(client, args.instance_id, args, deadline)


def _await(client: Client, instance_id: str, args: argparse.Namespace, deadline: float) -> int:
    """Wait until ``deadline`` (``--timeout`` counts from the command's start, connecting and
    catching up with the status topic included)."""
    try:
        state = client.wait_for_completion(instance_id, max(0.0, deadline - time.monotonic()))
    except WaitTimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    _print_state(state, args.json)
    return 0 if state.status is RuntimeStatus.COMPLETED else EXIT_FAILED


def _print_state(state: InstanceState, as_json: bool) -> None:
    if as_json:
        print(json.dumps(state.to_dict(), indent=2, sort_keys=True))
        return
    lines = [
        f"instance:     {state.instance_id}",
        f"workflow:     {state.name}" + (f" (version {state.version})" if state.version else ""),
        f"status:       {state.status.value}",
        *(
            [f"run:          {state.run_id} (generation {state.generation})"]
            if state.run_id
            else []
        ),
        f"created:      {state.created.isoformat()}",
        f"last updated: {state.last_updated.isoformat()}",
    ]
    data = state.to_dict()
    for key in ("input", "output", "custom_status"):
        if data[key] is not None:
            lines.append(f"{key + ':':<14}{json.dumps(data[key])}")
    if state.failure is not None:
        lines.append(f"failure:      {state.failure}")
    if state.unserved:
        lines.append(f"unserved:     {state.unserved}")
    if state.pending_reason:
        label = "parked:" if state.status is RuntimeStatus.PARKED else "pending:"
        lines.append(f"{label:<14}{state.pending_reason}")
    print("\n".join(lines))
