"""What the agent writes under ~/.hermes in the sandbox reaches the host at cleanup, through a
real Hermes: its own pull maps back only files it pushed (and skips entirely when it pushed
nothing, as for a new user), so the backend's own recovery brings back the rest before an
ephemeral sandbox is killed and at every persistent teardown. No LLM: the terminal tool is
called directly."""

from __future__ import annotations

import uuid

import pytest

from test_environment import run, sandboxes


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "ephemeral"])
@pytest.mark.parametrize("profile", ["new-user", "with-skills"])
def test_state_the_agent_wrote_in_the_sandbox_reaches_the_host_at_cleanup(home, e2b_local, persistent, profile):
    # contract: L4, S5, S6
    tag = uuid.uuid4().hex
    terminal = {"timeout": 60}
    extra_env = {}
    task = "t1"
    if not persistent:
        terminal["container_persistent"] = False
        extra_env["TERMINAL_CONTAINER_PERSISTENT"] = "false"
        task = "eph-1"
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), terminal=terminal)
    home.write_key()
    if profile == "with-skills":
        skill = home.path / "skills" / "mine" / "SKILL.md"
        skill.parent.mkdir(parents=True)
        skill.write_text("v1\n")
        memory = home.path / "memories" / "MEMORY.md"
        memory.parent.mkdir(parents=True)
        memory.write_text("host line\n")
    result = run(home, f"""
        from tools.terminal_tool_lifecycle import cleanup_vm
        r = {{}}
        r["write"] = T("mkdir -p ~/.hermes/skills/made-here ~/.hermes/memories && cd ~/.hermes"
                       " && printf 'made here\\\\n' > skills/made-here/SKILL.md"
                       " && printf 'sandbox line\\\\n' >> memories/MEMORY.md", task_id="{task}")
        if {profile == "with-skills"!r}:
            r["edit"] = T("echo v2 > ~/.hermes/skills/mine/SKILL.md", task_id="{task}")
        # Hermes keys its environments by scope (a persistent CLI session's is "default").
        key, env = next(iter(tt._active_environments.items()))
        r["id"] = env.sandbox_id
        cleanup_vm(key)
        finish(r)
    """, extra_env=extra_env)
    assert result["write"]["exit_code"] == 0, result["write"]
    sandbox_id = result["id"]

    made = home.path / "skills" / "made-here" / "SKILL.md"
    assert made.read_text() == "made here\n", "a skill created in a new directory came back"
    memory = home.path / "memories" / "MEMORY.md"
    quarantined = home.path / "cache" / "e2b-recovered" / sandbox_id / "memories" / "MEMORY.md"
    if profile == "new-user":
        # Nothing was ever pushed: Hermes' pull skipped; the recovery restored it.
        assert memory.read_text() == "sandbox line\n"
        assert not quarantined.exists()
    else:
        # Hermes' pull mapped the pushed skill's edit back; memories/ it never pushed, and
        # the host's MEMORY.md differs from the sandbox's: the host copy stays, the sandbox's
        # is kept beside it (S6). Neither is lost.
        assert (home.path / "skills" / "mine" / "SKILL.md").read_text() == "v2\n"
        assert memory.read_text() == "host line\n"
        assert quarantined.read_text() == "sandbox line\n"
    states = [s["state"] for s in sandboxes(e2b_local, tag)]
    if persistent:
        assert states == ["paused"], "persistent: paused at close once pulled, never killed (L3, L16)"
    else:
        assert states == [], "ephemeral: killed after the recovery (L4)"
