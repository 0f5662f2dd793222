"""Checkpoints, rollback and turn checkpoints through a real Hermes against e2b-local
(contract R1, R8, R11-R14): `hermes e2b checkpoint|checkpoints|rollback`, the in-session slash
commands, the agent's tool and the pre_tool_call turn hook."""

from __future__ import annotations

import json
import shlex
import textwrap
import uuid

import pytest

from conftest import assert_no_key
from test_cli import Session, e2b
from test_environment import PRELUDE


def drive(home, body):
    out = home.driver(PRELUDE + textwrap.dedent(body))
    assert_no_key(out["log"], json.dumps(out["result"]))
    return out["result"]


def profile_with(home, e2b_local, **extra):
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}, **extra), terminal={"timeout": 60})
    home.write_key()
    return home


SESSION_END = """
from tools.terminal_tool_lifecycle import cleanup_vm
cleanup_vm("default")
"""


def in_sandbox(home, command):
    """One Hermes session (task "default") that runs `command` and ends; its output."""
    result = drive(home, f"r = T({command!r}, task_id='default')\n" + SESSION_END + "finish(r)\n")
    assert result["exit_code"] == 0, result
    return result["output"]


# contract: R8, R12
def test_cli_checkpoint_break_rollback_restores_the_workspace_and_keeps_new_memories(home, e2b_local):
    profile_with(home, e2b_local)
    in_sandbox(home, "mkdir -p ~/work && printf good > ~/work/app.txt")

    taken = e2b(home, "checkpoint", "Before Upgrade", "--json")
    assert taken.returncode == 0, taken.stderr
    checkpoint = json.loads(taken.stdout)["checkpoint"]
    assert checkpoint["label"] == "before-upgrade" and checkpoint["reason"] == "manual"
    assert set(checkpoint) == {"snapshot_id", "name", "label", "reason", "automatic", "taken_at",
                               "taken_at_utc", "source_sandbox"}

    # The agent breaks the workspace and learns something; the host learns something too.
    in_sandbox(home, "rm -rf ~/work && mkdir -p ~/.hermes/memories && "
                     "printf 'learned after the checkpoint' > ~/.hermes/memories/MEMORY.md")
    (home.path / "memories").mkdir(exist_ok=True)
    (home.path / "memories" / "USER.md").write_text("the user prefers tabs")
    (home.path / "skills" / "deploy").mkdir(parents=True, exist_ok=True)
    (home.path / "skills" / "deploy" / "SKILL.md").write_text("---\nname: deploy\ndescription: d\n---\nlearned later")

    listed = json.loads(e2b(home, "checkpoints", "--json").stdout)
    assert [c["snapshot_id"] for c in listed["checkpoints"]] == [checkpoint["snapshot_id"]]
    status = e2b(home, "status")
    assert "newest checkpoint: before-upgrade" in status.stdout, status.stdout

    # Without a terminal and without --yes, nothing happens.
    unconfirmed = e2b(home, "rollback", "before-upgrade")
    assert unconfirmed.returncode == 2, unconfirmed.stdout
    assert "This restores before-upgrade" in unconfirmed.stdout
    assert "not confirmed" in unconfirmed.stderr

    rolled = e2b(home, "rollback", "before-upgrade", "--yes", "--json")
    assert rolled.returncode == 0, rolled.stderr
    report = json.loads(rolled.stdout)
    assert report["restored"]["snapshot_id"] == checkpoint["snapshot_id"]
    assert report["undo"]["reason"] == "rollback"
    assert report["retired_sandbox"] == checkpoint["source_sandbox"] != report["sandbox_id"]
    assert set(report) == {"task", "restored", "undo", "retired_sandbox", "sandbox_id", "recovered", "warnings"}

    # contract: R8, O6 — listings show the scope's template and which checkpoint the sandbox came
    # from, not the snapshot's internal name E2B reports as its template.
    (entry,) = [e for e in json.loads(e2b(home, "list", "--json").stdout) if e["sandbox_id"] == report["sandbox_id"]]
    assert (entry["template"], entry["restored_from"]) == ("base", "before-upgrade"), entry
    listed_line = next(line for line in e2b(home, "list").stdout.splitlines() if report["sandbox_id"] in line)
    assert "  base, restored from before-upgrade  " in listed_line, listed_line
    assert "hermes_" not in listed_line, listed_line
    assert "  template base, restored from before-upgrade, persistent" in e2b(home, "status").stdout

    # The workspace is the checkpoint's; Hermes' state is the newest: memories (Hermes keeps
    # them on the host) and a skill learned after the checkpoint, pushed into the new sandbox.
    after = in_sandbox(home, "cat ~/work/app.txt; echo; tail -n 1 ~/.hermes/skills/deploy/SKILL.md; echo; "
                             "echo $E2B_SANDBOX_ID")
    assert after.splitlines() == ["good", "learned later", report["sandbox_id"]], after
    assert (home.path / "memories" / "MEMORY.md").read_text() == "learned after the checkpoint"
    assert (home.path / "memories" / "USER.md").read_text() == "the user prefers tabs"

    # The undo point is a checkpoint like any other: rolling back to it brings the break back.
    undone = e2b(home, "rollback", report["undo"]["snapshot_id"], "--yes")
    assert undone.returncode == 0, undone.stderr
    assert "Rolled back to" in undone.stdout and "Undo: hermes e2b rollback" in undone.stdout
    assert in_sandbox(home, "ls ~/work 2>&1 || true").strip().endswith("No such file or directory")


# contract: R12
def test_checkpoints_without_a_task_lists_every_task_of_the_profile(home, e2b_local):
    profile_with(home, e2b_local)
    for chat in ("1", "2"):
        Session(home, chat=chat).stop()
    tasks = sorted(e["host"]["task_id"] for e in json.loads(e2b(home, "list", "--json").stdout))
    assert len(tasks) == 2 and all(t.startswith("session:") for t in tasks), tasks
    for n, task in enumerate(tasks):
        taken = e2b(home, "checkpoint", f"cp-{n}", "--task", task)
        assert taken.returncode == 0, taken.stderr

    everything = e2b(home, "checkpoints", "--json")
    assert everything.returncode == 0, everything.stderr
    listed = json.loads(everything.stdout)
    assert sorted((c["task"], c["label"]) for c in listed["checkpoints"]) == [(tasks[0], "cp-0"), (tasks[1], "cp-1")]
    text = e2b(home, "checkpoints").stdout
    for n, task in enumerate(tasks):
        assert f"Task {task}:\n  cp-{n}  [manual]" in text, text

    narrowed = json.loads(e2b(home, "checkpoints", "--task", tasks[1], "--json").stdout)
    assert (narrowed["task"], [c["label"] for c in narrowed["checkpoints"]]) == (tasks[1], ["cp-1"])
    # --turns reads one sandbox: the named task's, else task default's (none here).
    turns = json.loads(e2b(home, "checkpoints", "--turns", "--json").stdout)
    assert (turns["task"], turns["checkpoints"]) == ("default", []), turns


# contract: R1, R13
def test_a_live_sessions_scope_is_refused_to_the_cli_with_the_slash_command_hint(home, e2b_local):
    profile_with(home, e2b_local)
    session = Session(home)
    try:
        task = json.loads(e2b(home, "list", "--json").stdout)[0]["host"]["task_id"]
        refused = e2b(home, "checkpoint", "x", "--task", task)
        assert refused.returncode == 1
        assert "not the scope's writer" in refused.stderr, refused.stderr
        assert ("Hint: a Hermes session holds the writer role for this scope; run this in that session "
                "(/sandbox-checkpoint, /sandbox-checkpoints, /sandbox-rollback) or end it first") in refused.stderr
        nothing = e2b(home, "rollback", "--last", "--yes", "--task", task)
        assert nothing.returncode == 1 and "no checkpoint" in nothing.stderr, nothing.stderr
        both = e2b(home, "rollback", "x", "--last")
        assert both.returncode == 2 and "one of them" in both.stderr
    finally:
        session.stop()


# contract: R13
def test_slash_commands_and_the_agent_tool_in_a_session(home, e2b_local):
    profile_with(home, e2b_local, checkpoint_tool=True)
    result = drive(home, """
        from hermes_cli.plugins import get_plugin_command_handler, get_plugin_commands
        from hermes_cli.commands import resolve_command
        from tools.registry import registry
        r = {"ours": sorted(n for n in get_plugin_commands() if n.startswith("sandbox-")),
             "builtin_rollback": resolve_command("rollback") is not None}
        slash = lambda name, args="": get_plugin_command_handler(name)(args)
        r["before_attach"] = slash("sandbox-checkpoint", "early")
        T("mkdir -p ~/work && printf good > ~/work/app.txt", task_id="default")
        r["taken"] = slash("sandbox-checkpoint", "good")
        T("rm -rf ~/work && mkdir -p ~/.hermes/memories && printf 'noted in the sandbox' > ~/.hermes/memories/MEMORY.md",
          task_id="default")
        r["listed"] = slash("sandbox-checkpoints")
        r["rolled"] = slash("sandbox-rollback", "good")
        import hermes_constants, pathlib
        memory = pathlib.Path(hermes_constants.get_hermes_home()) / "memories" / "MEMORY.md"
        r["host_memory"] = memory.read_text() if memory.exists() else None
        r["after"] = T("cat ~/work/app.txt", task_id="default")["output"]
        r["usage"] = slash("sandbox-rollback", "a b")
        # The agent's tool: offered (checkpoint_tool: true), checkpoint, break, restore.
        r["offered"] = [d["function"]["name"] for d in registry.get_definitions({"sandbox_checkpoint"}, quiet=True)]
        call = lambda args: json.loads(registry.dispatch("sandbox_checkpoint", args, task_id="default"))
        r["tool_create"] = call({"action": "create", "name": "before-migration"})
        T("printf broken > ~/work/app.txt", task_id="default")
        r["tool_list"] = call({"action": "list"})
        r["tool_restore"] = call({"action": "restore", "name": "before-migration"})
        r["tool_after"] = T("cat ~/work/app.txt", task_id="default")["output"]
        r["tool_bad"] = call({"action": "explode"})
        from tools.terminal_tool_lifecycle import cleanup_vm
        cleanup_vm("default")
        finish(r)
    """)
    assert result["ours"] == ["sandbox-checkpoint", "sandbox-checkpoints", "sandbox-rollback"]
    assert result["builtin_rollback"], "Hermes' own /rollback stays Hermes'"
    # No environment yet: the command acts on the session's scope, as `hermes e2b checkpoint`.
    assert result["before_attach"].startswith("Checkpoint taken: early  [manual]"), result["before_attach"]
    assert result["taken"].startswith("Checkpoint taken: good  [manual]"), result["taken"]
    assert result["listed"].splitlines()[0].startswith("good  [manual]"), result["listed"]
    assert result["rolled"].startswith("Rolled back to good  [manual]"), result["rolled"]
    assert "Undo: hermes e2b rollback" in result["rolled"]
    assert result["after"] == "good"
    # Written in the sandbox after the checkpoint, in this session: the rollback recovered it.
    assert result["host_memory"] == "noted in the sandbox"
    assert result["usage"].startswith("usage: /sandbox-rollback")
    assert result["offered"] == ["sandbox_checkpoint"]
    assert result["tool_create"]["checkpoint"]["reason"] == "agent"
    assert result["tool_create"]["checkpoint"]["label"] == "before-migration"
    assert [c["label"] for c in result["tool_list"]["checkpoints"]][:1] == ["before-migration"]
    assert result["tool_restore"]["restored"]["label"] == "before-migration"
    assert result["tool_after"] == "good"
    assert result["tool_bad"] == {"error": "action must be create, list or restore"}


# contract: R13
def test_in_a_gateway_with_many_chats_a_slash_command_acts_on_its_own_chats_sandbox(home, e2b_local):
    """Hermes' gateway runs every chat's turns and slash commands in that chat's session
    context (``HERMES_SESSION_KEY``); a slash command acts on the sandbox created in its chat,
    never another's, and refuses in a chat that has none yet."""
    profile_with(home, e2b_local)
    result = drive(home, """
        from gateway.session_context import clear_session_vars, set_session_vars
        from hermes_cli.plugins import get_plugin_command_handler
        from tools.terminal_tool_lifecycle import cleanup_vm
        import tools.terminal_tool as terminal
        slash = lambda name, args="": get_plugin_command_handler(name)(args)
        def in_chat(chat, call):
            tokens = set_session_vars(platform="telegram", chat_id=chat, session_key=f"agent:main:telegram:dm:{chat}")
            try:
                return call()
            finally:
                clear_session_vars(tokens)
        r = {}
        for chat in ("1", "2"):
            r["made_" + chat] = in_chat(chat, lambda: T(f"echo chat {chat} > ~/who; cat ~/who", task_id=f"turn-{chat}"))["output"]
        r["keys"] = sorted(terminal._active_environments)
        r["taken_2"] = in_chat("2", lambda: slash("sandbox-checkpoint", "from-chat-two"))
        r["listed_1"] = in_chat("1", lambda: slash("sandbox-checkpoints"))
        r["listed_2"] = in_chat("2", lambda: slash("sandbox-checkpoints"))
        r["chat_3"] = in_chat("3", lambda: slash("sandbox-checkpoints"))
        r["no_chat"] = slash("sandbox-checkpoints")
        # As a chat user types it (the CLI's --yes): the rollback of chat two's own sandbox.
        in_chat("2", lambda: T("echo later > ~/who", task_id="turn-2"))
        r["rolled_2"] = in_chat("2", lambda: slash("sandbox-rollback", "from-chat-two --yes"))
        r["who_2"] = in_chat("2", lambda: T("cat ~/who", task_id="turn-2"))["output"]
        for key in list(terminal._active_environments):
            cleanup_vm(key)
        finish(r)
    """)
    assert result["made_1"] == "chat 1" and result["made_2"] == "chat 2"
    assert len(result["keys"]) == 2, f"one environment per chat: {result['keys']}"
    assert result["taken_2"].startswith("Checkpoint taken: from-chat-two"), result["taken_2"]
    assert "from-chat-two" in result["listed_2"]
    assert "from-chat-two" not in result["listed_1"] and result["listed_1"] == "No checkpoints of this scope."
    # A chat without a sandbox has its own scope, with no checkpoints: never another chat's.
    assert result["chat_3"] == "No checkpoints of this scope.", result["chat_3"]
    assert "2 E2B sandboxes are live in this process" in result["no_chat"]
    assert result["rolled_2"].startswith("Rolled back to from-chat-two"), result["rolled_2"]
    assert result["who_2"] == "chat 2"
    # The undo line runs as printed: it names the chat's task (issue 34).
    undo = next(line for line in result["rolled_2"].splitlines() if line.startswith("Undo: "))
    command = shlex.split(undo[len("Undo: "):])
    assert command[:3] == ["hermes", "e2b", "rollback"] and command[-2:] == ["--task", "session:agent:main:telegram:dm:2"], undo
    undone = e2b(home, *command[2:], "--yes")
    assert undone.returncode == 0 and "Rolled back to" in undone.stdout, undone.stdout + undone.stderr


CHAT = """
from gateway.session_context import clear_session_vars, set_session_vars
from hermes_cli.plugins import get_plugin_command_handler
from tools.terminal_tool_lifecycle import cleanup_vm
import tools.terminal_tool as terminal
slash = lambda name, args="": get_plugin_command_handler(name)(args)
def in_chat(chat, call):
    tokens = set_session_vars(platform="telegram", chat_id=chat, session_key=f"agent:main:telegram:dm:{chat}")
    try:
        return call()
    finally:
        clear_session_vars(tokens)
"""


# contract: R13
def test_a_chats_slash_commands_work_after_the_reaper_and_a_gateway_restart(home, e2b_local):
    """A chat's slash commands act on the chat's scope, found by E2B metadata, when no
    environment of it is live: after Hermes' idle reaper closed it, and in a restarted
    gateway process that has run nothing for the chat yet."""
    profile_with(home, e2b_local)
    first = drive(home, CHAT + textwrap.dedent("""
        r = {}
        r["made"] = in_chat("2", lambda: T("echo good > ~/who; cat ~/who", task_id="turn-2"))["output"]
        r["taken"] = in_chat("2", lambda: slash("sandbox-checkpoint", "good"))
        in_chat("2", lambda: T("echo broken > ~/who", task_id="turn-2"))
        # Hermes' idle reaper: the environment is torn down, the chat stays.
        keys = list(terminal._active_environments)
        for key in keys:
            terminal._last_activity[key] -= 100_000
        from tools.terminal_tool_lifecycle import _cleanup_inactive_envs
        _cleanup_inactive_envs(300)
        r["live_after_reaper"] = sorted(terminal._active_environments)
        r["listed_after_reaper"] = in_chat("2", lambda: slash("sandbox-checkpoints"))
        finish(r)
    """))
    assert first["made"] == "good" and first["taken"].startswith("Checkpoint taken: good"), first
    assert first["live_after_reaper"] == [], first
    assert first["listed_after_reaper"].startswith("good  [manual]"), first["listed_after_reaper"]

    # The gateway restarted: a new process, nothing run for the chat yet.
    second = drive(home, CHAT + textwrap.dedent("""
        r = {}
        r["other_chat"] = in_chat("3", lambda: slash("sandbox-checkpoints"))
        r["rolled"] = in_chat("2", lambda: slash("sandbox-rollback", "good --yes"))
        r["live_after_rollback"] = sorted(terminal._active_environments)
        r["who"] = in_chat("2", lambda: T("cat ~/who", task_id="turn-2"))["output"]
        for key in list(terminal._active_environments):
            cleanup_vm(key)
        finish(r)
    """))
    assert second["other_chat"] == "No checkpoints of this scope.", second["other_chat"]
    assert second["rolled"].startswith("Rolled back to good  [manual]"), second["rolled"]
    assert "no E2B sandbox" not in second["rolled"]
    undo = next(line for line in second["rolled"].splitlines() if line.startswith("Undo: "))
    assert undo.endswith("--task session:agent:main:telegram:dm:2"), undo
    assert second["live_after_rollback"] == [], "the rollback left no environment behind"
    assert second["who"] == "good", second


# contract: R11, R13
def test_the_agent_tool_is_not_offered_by_default_and_no_checkpoint_is_taken(home, e2b_local):
    profile_with(home, e2b_local)
    result = drive(home, """
        from tools.registry import registry
        r = {"offered": [d["function"]["name"] for d in registry.get_definitions({"sandbox_checkpoint"}, quiet=True)]}
        T("true", task_id="default")
        from hermes_cli.plugins import get_plugin_command_handler
        r["listed"] = get_plugin_command_handler("sandbox-checkpoints")("")
        from tools.terminal_tool_lifecycle import cleanup_vm
        cleanup_vm("default")
        finish(r)
    """)
    assert result["offered"] == []
    assert result["listed"] == "No checkpoints of this scope."


# contract: R11
def test_a_session_start_checkpoint_with_retention(home, e2b_local):
    profile_with(home, e2b_local, checkpoint_at_start=True, checkpoint_keep=2)
    for _ in range(3):
        in_sandbox(home, "true")
    e2b(home, "checkpoint", "named", "--json")
    listed = json.loads(e2b(home, "checkpoints", "--json").stdout)["checkpoints"]
    reasons = [(c["reason"], c["label"]) for c in listed]
    # Three sessions started; the oldest automatic one was pruned; the named one stays.
    assert reasons == [("manual", "named"), ("start", None), ("start", None)], reasons


# contract: R9, R10, R14
def test_turn_checkpoints_through_the_pre_tool_call_hook(home, e2b_local):
    profile_with(home, e2b_local, turn_checkpoints=3)
    result = drive(home, """
        from hermes_cli.plugins import invoke_hook, get_plugin_command_handler
        slash = lambda name, args="": get_plugin_command_handler(name)(args)
        def tool(name, args, turn):
            invoke_hook("pre_tool_call", tool_name=name, args=args, task_id="default",
                        session_id="s1", turn_id=turn)
        T("mkdir -p ~/work && printf v1 > ~/work/app.txt", task_id="default")
        r = {}
        # Turn 1: a read-only command takes nothing; the first destructive one takes one, the
        # second in the same turn takes none.
        tool("terminal", {"command": "ls ~/work"}, "turn-1")
        T("ls ~/work", task_id="default")
        r["after_read"] = slash("sandbox-checkpoints")
        tool("terminal", {"command": "rm -rf ~/work"}, "turn-1")
        T("rm -rf ~/work", task_id="default")
        tool("write_file", {"path": "~/work/app.txt"}, "turn-1")
        T("mkdir -p ~/work && printf v2 > ~/work/app.txt", task_id="default")
        # Turn 2: one more.
        tool("patch", {"path": "~/work/app.txt"}, "turn-2")
        T("printf v3 > ~/work/app.txt", task_id="default")
        r["listed"] = slash("sandbox-checkpoints")
        r["restored"] = slash("sandbox-rollback", "--turn 1")
        r["after"] = T("cat ~/work/app.txt", task_id="default")["output"]
        r["missing"] = slash("sandbox-rollback", "--turn 42")
        from tools.terminal_tool_lifecycle import cleanup_vm
        cleanup_vm("default")
        finish(r)
    """)
    assert result["after_read"] == "No checkpoints of this scope.", result["after_read"]
    turns = [line for line in result["listed"].splitlines() if line.startswith("  turn #")]
    assert len(turns) == 2, result["listed"]
    assert "turn #2  turn turn-2: before patch" in turns[0]
    assert "turn #1  turn turn-1: before terminal" in turns[1]
    assert result["restored"].startswith("Restored turn #1"), result["restored"]
    assert "Undo: /sandbox-rollback --turn 3" in result["restored"]
    assert result["after"] == "v1"
    assert "no checkpoint of this scope matches turn checkpoint 42" in result["missing"]
    cli = e2b(home, "checkpoints", "--turns", "--json")
    assert cli.returncode == 0, cli.stderr
    numbers = [t["number"] for t in json.loads(cli.stdout)["turns"]]
    assert numbers == [3, 2, 1], numbers
