"""`hermes e2b`: this profile's sandboxes from the Hermes CLI (status, list, rm, pull, doctor,
checkpoint, checkpoints, rollback, network).

Registered through Hermes' ``ctx.register_cli_command`` when the host has it. An adapter
only: argparse in, text or JSON out. What a sandbox is, who owns it, what a removal may
touch and how a pull runs are the native core's (``_native.Inventory``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from typing import Any, Callable, Optional

from ._core import NATIVE_IMPORT_ERROR, redact
from ._hermes import inventory, native_settings, profile_settings, read_settings
from .checkpoints import describe

#: The exit code of a command that did not do everything asked (a refusal, a failure).
EXIT_INCOMPLETE = 1
#: The exit code when `rm` needs a confirmation it cannot ask for (no TTY, no --yes).
EXIT_UNCONFIRMED = 2
#: The exit code when the reader closed stdout early (`| head`): a shell's for SIGPIPE.
EXIT_CLOSED_PIPE = 141

HELP = "Manage this profile's E2B sandboxes (status, list, rm, pull, doctor, checkpoint, checkpoints, rollback, network)"


def setup(parser: argparse.ArgumentParser) -> None:
    """Builds the `hermes e2b` argument tree (Hermes' setup_fn)."""
    sub = parser.add_subparsers(dest="e2b_command", metavar="COMMAND")
    status = sub.add_parser("status", help="this profile's sandboxes with this host's view of each scope")
    status.add_argument("--json", action="store_true", help="print JSON")
    listing = sub.add_parser("list", help="one line per session's sandbox: state, last use, idle time; most recently used first")
    listing.add_argument("--all", action="store_true", help="include other profiles' sandboxes (marked)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    rm = sub.add_parser("rm", help="kill sandboxes (asks first; --yes to skip)")
    rm.add_argument("ids", nargs="*", metavar="ID", help="sandbox ids")
    rm.add_argument("--paused", action="store_true", help="this profile's paused sandboxes (all, or those --older-than and --task select)")
    rm.add_argument("--older-than", metavar="DURATION", help="with --paused: only those unused (last use and pause) at least this long: 30m, 2h, 1d, 1d12h")
    rm.add_argument("--task", action="append", default=[], metavar="ID", help="with --paused: only this task's (as `hermes e2b list` shows it); repeatable")
    rm.add_argument("--dry-run", action="store_true", help="show what would be killed and what it loses; kill nothing")
    rm.add_argument("--duplicates", action="store_true", help="this profile's duplicates (the newest of each scope is kept)")
    rm.add_argument("--yes", action="store_true", help="do not ask")
    rm.add_argument("--force", action="store_true", help="also kill one a live session on this host writes to")
    rm.add_argument("--json", action="store_true", help="print JSON")
    pull = sub.add_parser("pull", help="recover skills/ and memories/ from a sandbox into this host's Hermes home; "
                          "or, with --subagent, a delegated child's work from its fork into its parent's sandbox")
    pull.add_argument("--task", default="default", metavar="ID", help="the task (container key); default: default")
    pull.add_argument("--subagent", metavar="FORK", help="a subagent's fork left by a process that died mid-child "
                      "(`hermes e2b list` shows it): bring its work back to its parent's sandbox, then kill it")
    pull.add_argument("--json", action="store_true", help="print JSON")
    doctor = sub.add_parser("doctor", help="the E2B backend's checks (works inside containers too)")
    doctor.add_argument("--live", action="store_true", help="also create a probe sandbox (billed for its seconds), check its template has bash, tar, flock, setsid, date and a writable home, kill it")
    doctor.add_argument("--json", action="store_true", help="print JSON")
    checkpoint = sub.add_parser("checkpoint", help="checkpoint a scope's sandbox (an E2B snapshot; named ones are never pruned)")
    checkpoint.add_argument("name", nargs="?", help="a name (lowercase letters, digits, '-')")
    checkpoint.add_argument("--task", default="default", metavar="ID", help="the task (container key); default: default")
    checkpoint.add_argument("--json", action="store_true", help="print JSON")
    checkpoints = sub.add_parser("checkpoints", help="the checkpoints of every task of this profile, or of one (--task), newest first")
    checkpoints.add_argument("--task", default=None, metavar="ID", help="only this task (container key); default: every task this host knows of the profile's sandboxes")
    checkpoints.add_argument("--turns", action="store_true", help="also the turn checkpoints kept in the sandbox (attaches to it): one task's, default: default")
    checkpoints.add_argument("--json", action="store_true", help="print JSON")
    rollback = sub.add_parser("rollback", help="roll a scope's sandbox back to a checkpoint (asks first; --yes to skip)")
    rollback.add_argument("name", nargs="?", help="a checkpoint's name or snapshot id")
    rollback.add_argument("--last", action="store_true", help="the newest checkpoint not taken by a rollback")
    rollback.add_argument("--turn", type=int, metavar="N", help="a turn checkpoint (in the sandbox) instead")
    rollback.add_argument("--task", default="default", metavar="ID", help="the task (container key); default: default")
    rollback.add_argument("--yes", action="store_true", help="do not ask")
    rollback.add_argument("--json", action="store_true", help="print JSON")
    network = sub.add_parser("network", help="the egress policy (allow_out, deny_out): show it, or change it for the profile and its running sandboxes")
    network.add_argument("--allow", action="append", default=[], metavar="DEST", help="add to allow_out: an IPv4 address, CIDR block or domain name (*.example.com for subdomains); repeatable")
    network.add_argument("--deny", action="append", default=[], metavar="DEST", help="add to deny_out: an IPv4 address or CIDR block (0.0.0.0/0: all); repeatable")
    network.add_argument("--remove", action="append", default=[], metavar="DEST", help="remove from both lists; repeatable")
    network.add_argument("--clear", action="store_true", help="empty both lists first")
    network.add_argument("--apply", action="store_true", help="put the policy in force on the running sandboxes now, without changing it")
    network.add_argument("--json", action="store_true", help="print JSON")
    credentials = sub.add_parser("credentials", help="the credentials the sandbox never holds: names, hosts, header, whether the profile has a value, which sandboxes have them (never a value)")
    credentials.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(e2b_parser=parser)


def make_handler(ctx: Any) -> Callable[[argparse.Namespace], int]:
    """Hermes' handler_fn: dispatches to the subcommand; its int is the exit code."""

    def handler(args: argparse.Namespace) -> int:
        command = getattr(args, "e2b_command", None)
        if command is None:
            args.e2b_parser.print_help()
            return EXIT_UNCONFIRMED
        try:
            code = _COMMANDS[command](ctx, args)
            # A pipe's buffer is written here, so a closed pipe is found here, not at exit.
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            return _closed_pipe()
        except Exception as error:  # noqa: BLE001 - one line, never a traceback with settings in it
            print(f"hermes e2b {command}: {redact(str(error))}", file=sys.stderr)
            return EXIT_INCOMPLETE

    return handler


def _closed_pipe() -> int:
    """The reader of stdout went away (`hermes e2b list | head -1`): stop quietly, like any
    Unix tool. stdout is pointed at /dev/null so the interpreter's last flush at exit does not
    report the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout: nothing left to flush into the pipe
        pass
    return EXIT_CLOSED_PIPE


def _inventory(ctx: Any, progress: Optional[Callable[..., None]] = None) -> Any:
    if NATIVE_IMPORT_ERROR is not None:
        raise RuntimeError(f"the native core is not importable: {NATIVE_IMPORT_ERROR}")
    return inventory(native_settings(read_settings(ctx)), progress)


class _Bars:
    """The native core's progress reports drawn with rich (Hermes' terminal library), one bar
    per operation; only ever built when stdout is a terminal."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[amount]}"),
                                  TimeElapsedColumn(), transient=False)
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> "_Bars":
        self._progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.stop()

    def __call__(self, operation: str, unit: str, done: int, total: Optional[int], finished: bool) -> None:
        if unit == "bytes":
            amount = f"{done / 2**20:.1f} MiB" + (f" of {total / 2**20:.1f} MiB" if total is not None else "")
        else:
            amount = f"{done} of {total if total is not None else '?'} {unit}"
        task = self._tasks.get(operation)
        if task is None:
            task = self._tasks[operation] = self._progress.add_task(f"E2B {operation}", total=total, amount=amount)
        self._progress.update(task, completed=done, total=total, amount=amount)


def _with_progress(ctx: Any, run: Callable[[Any], Any]) -> Any:
    """Runs `run(inventory)`, with progress bars on a terminal and nothing otherwise."""
    if not sys.stdout.isatty():
        return run(_inventory(ctx))
    with _Bars() as bars:
        return run(_inventory(ctx, progress=bars))


def _print_json(value: Any) -> None:
    print(redact(json.dumps(value, indent=2, sort_keys=True)))


def _when(seconds: float) -> str:
    return _dt.datetime.fromtimestamp(seconds, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(seconds: Optional[int]) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _last_use(entry: Optional[dict]) -> str:
    """When the entry was last used; `~` marks an estimate from E2B's lease end."""
    if entry is None or entry["last_used_at"] is None:
        return "-"
    return ("~" if entry["last_used_source"] == "lease" else "") + _when(entry["last_used_at"])


def _idle(entry: dict) -> str:
    return "running a command" if entry["running_command"] else _duration(entry["idle_seconds"])


def _aligned(rows: list[list[str]]) -> list[str]:
    """Rows as lines, every column but the last padded to its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]).rstrip()
            for row in rows]


def _template(entry: dict) -> str:
    """The template, and for a sandbox made from a checkpoint (a rollback) which one."""
    restored = entry.get("restored_from")
    return f"{entry['template']}, restored from {restored}" if restored else entry["template"]


def _scope_name(entry: dict) -> str:
    host = entry.get("host") or {}
    return host.get("task_id") or f"scope {entry['scope'][:12]}"


def _settings(ctx: Any) -> Any:
    return profile_settings(ctx)


def _profile_tasks(entries: list) -> list[str]:
    """The tasks (container keys) of the listed sandboxes this host knows, in listing order."""
    tasks: list[str] = []
    for entry in entries:
        task = (entry.get("host") or {}).get("task_id")
        if task is not None and task not in tasks:
            tasks.append(task)
    return tasks


def _task_checkpoints(ctx: Any, tasks: list[str]) -> dict[str, list]:
    """Each task's checkpoints, newest first: one snapshot list per task."""
    from .checkpoints import scope_backend

    settings = _settings(ctx)
    found: dict[str, list] = {}
    for task in tasks:
        with scope_backend(settings, task) as backend:
            found[task] = backend.checkpoints()
    return found


def _newest_checkpoints(ctx: Any, entries: list) -> None:
    """Adds ``newest_checkpoint`` (a dict or None) to each entry: one snapshot list per task."""
    by_task = _task_checkpoints(ctx, _profile_tasks(entries))
    for entry in entries:
        listed = by_task.get((entry.get("host") or {}).get("task_id"))
        entry["newest_checkpoint"] = listed[0] if listed else None


def _status(ctx: Any, args: argparse.Namespace) -> int:
    entries = _inventory(ctx).list("profile")
    _newest_checkpoints(ctx, entries)
    if args.json:
        _print_json(entries)
        return 0
    if not entries:
        print("No E2B sandboxes for this profile.")
        return 0
    for entry in entries:
        lease = f", lease {_duration(entry['lease_left_seconds'])} left" if entry["state"] == "running" else ""
        print(f"{_scope_name(entry)}: {entry['sandbox_id']} {entry['state']}{lease}")
        print(f"  template {_template(entry)}, {entry['mode']}, {entry['posture'] or 'posture not recorded'}")
        print(f"  started or resumed {_when(entry['started_at'])}")
        host = entry.get("host")
        if host is None:
            print("  this host: never coordinated this scope")
        else:
            if host["writer"] == "held":
                pid = f" by pid {host['writer_pid']}" if host["writer_pid"] else ""
                writer = f"held{pid}"
            elif host["writer"] == "free":
                writer = "free"
            else:
                writer = f"unknown ({host['writer_detail'] or 'no file locking'})"
            if host["prepared_for"] == entry["sandbox_id"]:
                prepared = "prepared"
            elif host["prepared_for"]:
                prepared = f"prepared for {host['prepared_for']}"
            else:
                prepared = "not prepared"
            dirty = f"dirty ({host['dirty']})" if host["dirty"] else "clean"
            print(f"  writer {writer}; {dirty}; {prepared}")
            print(f"  last pull: {host['last_pull'] or 'none recorded'}")
            print(f"  last recovery: {host['last_recovery'] or 'none recorded'}")
        newest = entry.get("newest_checkpoint")
        if newest:
            print(f"  newest checkpoint: {describe(newest)}")
        if entry["duplicate_of"]:
            print(f"  DUPLICATE: sessions use {entry['duplicate_of']}; `hermes e2b rm --duplicates` removes it")
    return 0


def _list(ctx: Any, args: argparse.Namespace) -> int:
    entries = _inventory(ctx).list("all" if args.all else "profile", by_last_use=True)
    if args.json:
        _print_json(entries)
        return 0
    if not entries:
        print("No E2B sandboxes made by hermes-e2b for this key." if args.all
              else "No E2B sandboxes for this profile (--all: every profile's).")
        return 0
    rows = [["SESSION", "STATE", "LAST USE", "IDLE", "SANDBOX", "TEMPLATE", "MODE", "LEASE"]]
    for entry in entries:
        marks = []
        if entry["owner"] != "this-profile":
            marks.append(entry["owner"])
        if entry["duplicate_of"]:
            marks.append(f"duplicate of {entry['duplicate_of']}")
        if entry.get("subagent"):
            marks.append(f"subagent {entry['subagent']}'s fork of {entry['subagent_of']}" + (
                f": its work is not back, hermes e2b pull --subagent {entry['sandbox_id']}"
                if entry.get("subagent_recoverable") else
                f": kept for {entry['subagent_held']}" if entry.get("subagent_held") else ""))
        if entry["state"] == "running":
            lease = f"lease {_duration(entry['lease_left_seconds'])}"
        elif entry["paused_at"] is not None:
            lease = f"paused {_when(entry['paused_at'])}"
        else:
            lease = "-"
        rows.append([_scope_name(entry), entry["state"], _last_use(entry), _idle(entry), entry["sandbox_id"],
                     _template(entry), entry["mode"], lease + (f"  [{'; '.join(marks)}]" if marks else "")])
    print("\n".join(_aligned(rows)))
    return 0


def _rm(ctx: Any, args: argparse.Namespace) -> int:
    chosen = [bool(args.ids), args.paused, args.duplicates]
    if sum(chosen) != 1:
        print("hermes e2b rm: name sandbox ids, or --paused, or --duplicates (one of them)", file=sys.stderr)
        return EXIT_UNCONFIRMED
    if (args.older_than is not None or args.task) and not args.paused:
        print("hermes e2b rm: --older-than and --task select among paused sandboxes; add --paused", file=sys.stderr)
        return EXIT_UNCONFIRMED
    target = "ids" if args.ids else "paused" if args.paused else "duplicates"
    selection = {"force": args.force, "older_than": args.older_than, "tasks": list(args.task)}
    inventory = _inventory(ctx)
    plan = inventory.plan_removal(target, list(args.ids), **selection)
    kills = [item for item in plan if item["action"] == "kill"]
    if args.dry_run:
        return _rm_dry_run(plan, kills, args.json)
    if kills and not args.yes:
        print("This kills, for good:")
        for item in kills:
            print(f"  {item['sandbox_id']} ({_scope_name(item['entry'])}): {item['detail']}")
        if not sys.stdin.isatty():
            print("hermes e2b rm: not confirmed; run again with --yes", file=sys.stderr)
            return EXIT_UNCONFIRMED
        answer = input(f"Kill {len(kills)} sandbox{'es' if len(kills) != 1 else ''}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing killed.")
            return EXIT_UNCONFIRMED
    removed = inventory.remove(target, list(args.ids), **selection)
    if args.json:
        _print_json(removed)
    else:
        if not removed:
            print("Nothing to remove.")
        for item in removed:
            detail = f": {item['detail']}" if item["detail"] else ""
            print(f"{item['sandbox_id']}: {item['outcome'].replace('_', ' ')}{detail}")
    ok = all(item["outcome"] in ("killed", "already_gone") for item in removed)
    return 0 if ok else EXIT_INCOMPLETE


def _rm_dry_run(plan: list, kills: list, as_json: bool) -> int:
    """``rm --dry-run``: the plan, as the confirmation shows it, with the refusals; nothing
    is killed."""
    if as_json:
        _print_json([{k: v for k, v in item.items() if k != "entry"} for item in plan])
        return 0
    if not plan:
        print("Nothing to remove.")
    if kills:
        print("Would kill, for good (--dry-run: nothing killed):")
        for item in kills:
            print(f"  {item['sandbox_id']} ({_scope_name(item['entry'])}, last use {_last_use(item['entry'])}): {item['detail']}")
    for item in plan:
        if item["action"] != "kill":
            detail = f": {item['detail']}" if item["detail"] else ""
            print(f"{item['sandbox_id']}: would be {'refused' if item['action'] == 'refuse' else 'already gone'}{detail}")
    return 0


def _pull(ctx: Any, args: argparse.Namespace) -> int:
    if args.subagent:
        from . import _native

        back = _with_progress(ctx, lambda inventory: _native.pull_subagent(inventory, args.subagent))
        if args.json:
            _print_json({"fork": args.subagent, **back})
        else:
            print(back["summary"])
        return 0
    summary = _with_progress(ctx, lambda inventory: inventory.pull(args.task))
    if args.json:
        _print_json({"task": args.task, **summary})
    else:
        print(
            f"Pulled task {args.task}: {summary['restored']} restored, {summary['unchanged']} unchanged, "
            f"{summary['quarantined']} quarantined, {summary['skipped']} skipped."
        )
    return 0


def _doctor(ctx: Any, args: argparse.Namespace) -> int:
    from .provider import E2BProvider

    rows = [{"ok": ok, "check": name, "detail": detail} for ok, name, detail in E2BProvider(ctx).doctor_checks()]
    if NATIVE_IMPORT_ERROR is None:
        locking = _inventory(ctx).host_locking()
        rows.append({"ok": locking is None, "check": "E2B host locking",
                     "detail": "file locks work in this profile's cache/e2b" if locking is None else locking})
        if args.live:
            for step in _with_progress(ctx, lambda inventory: inventory.live_check()):
                detail = f"{step['seconds'] * 1000:.0f} ms" + (f": {step['error']}" if step["error"] else "")
                rows.append({"ok": step["ok"], "check": f"E2B live: {step['step']}", "detail": detail})
    rows = [{**row, "check": redact(row["check"]), "detail": redact(row["detail"])} for row in rows]
    if args.json:
        _print_json(rows)
    else:
        for row in rows:
            print(f"{'ok  ' if row['ok'] else 'FAIL'}  {row['check']}: {row['detail']}")
    return 0 if all(row["ok"] for row in rows) else EXIT_INCOMPLETE


def _checkpoint(ctx: Any, args: argparse.Namespace) -> int:
    from .checkpoints import scope_backend

    with scope_backend(_settings(ctx), args.task) as backend:
        taken = backend.checkpoint(args.name, reason="manual")
    if args.json:
        _print_json({"task": args.task, "checkpoint": taken})
    else:
        print(f"Checkpoint taken: {describe(taken)}")
        print(f"Roll back to it: hermes e2b rollback {taken['label'] or taken['snapshot_id']}")
    return 0


def _checkpoints(ctx: Any, args: argparse.Namespace) -> int:
    from .checkpoints import describe_turn, describe_with_id, scope_backend

    if args.task is None and not args.turns:
        return _all_checkpoints(ctx, args)
    args.task = args.task or "default"
    with scope_backend(_settings(ctx), args.task) as backend:
        listed = backend.checkpoints()
        turns = backend.turn_checkpoints() if args.turns else None
    if args.json:
        _print_json({"task": args.task, "checkpoints": listed, **({"turns": turns} if turns is not None else {})})
        return 0
    if not listed:
        print(f"No checkpoints of task {args.task}.")
    for checkpoint in listed:
        print(describe_with_id(checkpoint))
    if turns is not None:
        print("Turn checkpoints (in the sandbox):" if turns else "No turn checkpoints in the sandbox.")
        for turn in turns:
            print(f"  {describe_turn(turn)}")
    return 0


def _all_checkpoints(ctx: Any, args: argparse.Namespace) -> int:
    """``checkpoints`` without ``--task``: every task of the profile's sandboxes this host knows
    (``hermes e2b list`` shows them), each checkpoint with its task."""
    from .checkpoints import describe_with_id

    tasks = _profile_tasks(_inventory(ctx).list("profile", by_last_use=True))
    by_task = _task_checkpoints(ctx, tasks)
    if args.json:
        listed = [{**c, "task": task} for task in tasks for c in by_task[task]]
        listed.sort(key=lambda c: c["taken_at"], reverse=True)
        _print_json({"task": None, "tasks": tasks, "checkpoints": listed})
        return 0
    if not any(by_task.values()):
        print("No checkpoints of this profile's tasks." if tasks else "No E2B sandboxes for this profile.")
    for task in tasks:
        if not by_task[task]:
            continue
        print(f"Task {task}:")
        for checkpoint in by_task[task]:
            print("  " + describe_with_id(checkpoint).replace("\n", "\n  "))
    return 0


def _confirm(question: str, yes: bool) -> Optional[int]:
    """None to go on; else the exit code (not confirmed)."""
    if yes:
        return None
    if not sys.stdin.isatty():
        print("hermes e2b rollback: not confirmed; run again with --yes", file=sys.stderr)
        return EXIT_UNCONFIRMED
    if input(f"{question} [y/N] ").strip().lower() not in ("y", "yes"):
        print("Nothing rolled back.")
        return EXIT_UNCONFIRMED
    return None


def _rollback(ctx: Any, args: argparse.Namespace) -> int:
    from .checkpoints import describe_turn, rollback_lines, scope_backend, turn_restore_lines

    chosen = [args.name is not None, args.last, args.turn is not None]
    if sum(chosen) != 1:
        print("hermes e2b rollback: name a checkpoint, or --last, or --turn N (one of them)", file=sys.stderr)
        return EXIT_UNCONFIRMED
    settings = _settings(ctx)
    with scope_backend(settings, args.task) as backend:
        if args.turn is not None:
            turns = {t["number"]: t for t in backend.turn_checkpoints()}
            target = turns.get(args.turn)
            if target is None:
                print(f"hermes e2b rollback: no turn checkpoint {args.turn} in the sandbox "
                      f"(hermes e2b checkpoints --turns lists them)", file=sys.stderr)
                return EXIT_INCOMPLETE
            if not args.yes:
                print(f"This puts {target['directory']} back as it was at {describe_turn(target)}.")
                print("Its current state is kept first as a new turn checkpoint (the undo point).")
            refused = _confirm("Restore it?", args.yes)
            if refused is not None:
                return refused
            report = backend.restore_turn(args.turn, keep=max(1, settings.turn_checkpoints))
            if args.json:
                _print_json({"task": args.task, **report})
            else:
                print("\n".join(turn_restore_lines(report)))
            return 0
        listed = backend.checkpoints()
        if args.last:
            target = next((c for c in listed if c["reason"] not in ("rollback", "adopt")), None)
        else:
            wanted = {args.name, args.name.strip().lower().replace(" ", "-")}
            target = next((c for c in listed if wanted & {c["snapshot_id"], c["label"], c["name"]}), None)
        if target is None:
            print(f"hermes e2b rollback: no checkpoint of task {args.task} matches "
                  f"{'--last' if args.last else args.name} (hermes e2b checkpoints lists them)", file=sys.stderr)
            return EXIT_INCOMPLETE
        if not args.yes:
            print(f"This restores {describe(target)}:")
            print("  the workspace and installed packages become the checkpoint's; skills/ and memories/ stay the newest.")
            print("  The current sandbox is checkpointed first (the undo point), then replaced.")
        refused = _confirm("Roll back?", args.yes)
        if refused is not None:
            return refused
        report = backend.rollback(target["snapshot_id"])
    if args.json:
        _print_json({"task": args.task, **report})
    else:
        print("\n".join(rollback_lines(report, args.task)))
    return 0 if not report["warnings"] else EXIT_INCOMPLETE


def _as_list(value: Any) -> list[str]:
    """A destination list as config.yaml may hold it (a list, or text)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(item).strip() for item in value if str(item).strip()]
    text = str(value).strip()
    if text.startswith("["):
        return [str(item).strip() for item in json.loads(text)]
    return [item for item in text.replace(",", " ").split() if item]


def _save_setting(ctx: Any, key: str, value: Any) -> None:
    """Writes one plugin setting through Hermes' own writer (atomic, lock-protected)."""
    set_config = getattr(ctx, "set_config", None)
    if callable(set_config):
        set_config(key, value)
        return
    from hermes_cli.plugins_state import save_plugin_setting

    save_plugin_setting(getattr(ctx, "plugin_id", None) or "e2b", (key,), value)


def _network_lines(settings: Any, sandboxes: list, changed: bool) -> list[str]:
    lines = [f"Profile policy: {settings.egress_summary()}"]
    lines.append(f"  allow_out: {', '.join(settings.allow_out) or '(none)'}")
    lines.append(f"  deny_out: {', '.join(settings.deny_out) or '(none)'}")
    if not sandboxes:
        lines.append("No E2B sandboxes for this profile.")
    words = {
        "in_force": "the profile's policy is in force",
        "updated": "updated now to the profile's policy",
        "at_resume": "paused; gets the profile's policy when resumed, before any command",
        "differs": "not the profile's policy; a session puts it in force before its next command (--apply: now)",
        "failed": "the update failed",
    }
    for entry in sandboxes:
        rules = entry.get("rules")
        has = rules["summary"] if rules else "rules not reported"
        detail = f": {entry['detail']}" if entry.get("detail") else ""
        lines.append(f"{_scope_name(entry)}: {entry['sandbox_id']} {entry['state']}")
        lines.append(f"  has: {has}")
        lines.append(f"  {words[entry['outcome']]}{detail}")
    if changed:
        lines.append("Running Hermes sessions of this profile use the new policy from their next command.")
    return lines


def _network(ctx: Any, args: argparse.Namespace) -> int:
    from . import _native

    changing = bool(args.allow or args.deny or args.remove or args.clear)
    if changing:
        raw = read_settings(ctx)
        allow = [] if args.clear else _as_list(raw.get("allow_out"))
        deny = [] if args.clear else _as_list(raw.get("deny_out"))
        removed = set(args.remove)
        allow = [d for d in allow if d not in removed] + [d for d in args.allow if d not in allow]
        deny = [d for d in deny if d not in removed] + [d for d in args.deny if d not in deny]
        # Validated before anything is written: a refused entry changes nothing.
        native_settings({**raw, "allow_out": allow, "deny_out": deny})
        _save_setting(ctx, "allow_out", allow)
        _save_setting(ctx, "deny_out", deny)
    settings = _settings(ctx)
    inventory = _inventory(ctx)
    policy = inventory.egress_policy()
    sandboxes = inventory.apply_egress() if changing or args.apply else inventory.list("profile")
    for entry in sandboxes:
        # What E2B reports the sandbox has (one request each; only this command pays it).
        try:
            entry["rules"] = inventory.sandbox_rules(entry["sandbox_id"])
        except _native.E2BError as error:
            entry["rules"] = None
            entry["detail"] = entry.get("detail") or str(error)
        if "outcome" not in entry:
            known = entry["rules"]["digest"] if entry["rules"] else entry["egress_known"]
            entry["outcome"] = "in_force" if known == policy["digest"] else (
                "differs" if entry["state"] == "running" else "at_resume")
            entry["detail"] = entry.get("detail")
    if args.json:
        _print_json({
            "allow_out": settings.allow_out,
            "deny_out": settings.deny_out,
            "allow_internet_access": settings.allow_internet_access,
            "effective": policy,
            "sandboxes": [{"sandbox_id": e["sandbox_id"], "task_id": (e.get("host") or {}).get("task_id"),
                           "state": e["state"], "outcome": e["outcome"], "detail": e["detail"],
                           "rules": e["rules"]} for e in sandboxes],
        })
    else:
        print("\n".join(_network_lines(settings, sandboxes, changing)))
    return 0 if all(e["outcome"] != "failed" for e in sandboxes) else EXIT_INCOMPLETE


def _credentials(ctx: Any, args: argparse.Namespace) -> int:
    """``hermes e2b credentials``: what the ``credentials`` setting (and Hermes' own egress
    firewall) configure, whether the profile's ``.env`` has each value, where the values are
    kept (E2B Secrets: each secret's name and last update; or the rules, and why), and which
    header names E2B holds for each of the profile's sandboxes, with the hosts whose rules
    still hold a value. Never a value (X17, X22)."""
    from . import _native

    inventory = _inventory(ctx)
    configured = inventory.credentials()
    sources = {c["name"]: c["source"] for c in _settings(ctx).credentials}
    store: Optional[dict[str, Any]] = None
    store_error = None
    if configured:
        try:
            store = inventory.credential_store()
        except _native.E2BError as error:
            store_error = str(error)
    sandboxes = []
    for entry in inventory.list("profile"):
        held: Optional[dict[str, Any]]
        detail = None
        try:
            held = inventory.sandbox_credential_headers(entry["sandbox_id"])
        except _native.E2BError as error:
            held, detail = None, str(error)
        sandboxes.append({"sandbox_id": entry["sandbox_id"], "state": entry["state"],
                          "task_id": (entry.get("host") or {}).get("task_id"),
                          "headers": held["headers"] if held else None,
                          "values_in_rules": held["values_in_rules"] if held else None,
                          "detail": detail})
    if args.json:
        _print_json({
            "credentials": [{**c, "source": sources.get(c["name"], "settings")} for c in configured],
            "store": store if store is not None else ({"error": store_error} if store_error else None),
            "sandboxes": sandboxes,
        })
    else:
        lines = []
        if not configured:
            lines.append("No credentials configured (plugins.entries.e2b.settings.credentials).")
        for c in configured:
            value = "value set" if c["has_value"] else "NO VALUE: set it in the profile's .env"
            lines.append(f"{c['name']}: {', '.join(c['hosts'])} ({c['header']}; {value}; "
                         f"from {sources.get(c['name'], 'settings')})")
        if store is not None:
            lines.append(f"Values kept in: {store['summary']}")
            for secret in store["secrets"]:
                lines.append(f"  {secret['name']} ({secret['variable'] or '?'}; version "
                             f"{secret['version']}, updated {secret['updated_at']})")
        elif store_error is not None:
            lines.append(f"Values kept in: not read: {store_error}")
        for box in sandboxes:
            lines.append(f"{box['sandbox_id']} {box['state']}")
            if box["headers"] is None:
                lines.append(f"  not read: {box['detail']}")
            elif not box["headers"]:
                lines.append("  no credential headers")
            for host, names in sorted((box["headers"] or {}).items()):
                held_as = "value in the rules" if host in (box["values_in_rules"] or []) else "E2B secret"
                lines.append(f"  {host}: {', '.join(names)} ({held_as})")
        print("\n".join(lines))
    return 0 if all(c["has_value"] for c in configured) and store_error is None else EXIT_INCOMPLETE


_COMMANDS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "status": _status,
    "list": _list,
    "rm": _rm,
    "pull": _pull,
    "doctor": _doctor,
    "checkpoint": _checkpoint,
    "checkpoints": _checkpoints,
    "rollback": _rollback,
    "network": _network,
    "credentials": _credentials,
}
