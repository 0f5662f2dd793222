"""A gateway's chats see only their own attachments (issue 34, contract X19): Hermes keeps
every chat's attachments in one profile cache (`cache/documents/doc_<hex>_<name>`, named in
that chat's messages only) and would push all of them into every chat's sandbox. Each chat
here runs its turn as Hermes' gateway does: in its session context, Hermes' own
`pre_llm_call` hook dispatch with the turn's messages, then the terminal tool."""

from __future__ import annotations

import uuid

from test_environment import run


def test_one_chats_attachment_never_reaches_another_chats_sandbox(home, e2b_local):
    # contract: X19
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), terminal={"timeout": 60})
    home.write_key()
    documents = home.path / "cache" / "documents"
    documents.mkdir(parents=True)
    mine = documents / "doc_0a1b2c3d4e5f_contract draft.pdf"
    theirs = documents / "doc_f5e4d3c2b1a0_payslip.pdf"
    mine.write_text("alice's contract\n")
    theirs.write_text("bob's payslip\n")
    skill = home.path / "skills" / "shared" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("# profile-wide\n")
    result = run(home, f"""
        from gateway.session_context import clear_session_vars, set_session_vars
        from hermes_cli.lifecycle import invoke_hook
        from tools.terminal_tool_lifecycle import cleanup_vm
        def turn(chat, text, command):
            tokens = set_session_vars(platform="telegram", chat_id=chat, session_key=f"agent:main:telegram:dm:{{chat}}")
            try:
                invoke_hook("pre_llm_call", session_id=f"s-{{chat}}", task_id=f"turn-{{chat}}", turn_id="1",
                            user_message=text, conversation_history=[{{"role": "user", "content": text}}],
                            is_first_turn=True, model="m", platform="telegram", parent_session_id="", sender_id=chat)
                return T(command, task_id=f"turn-{{chat}}")
            finally:
                clear_session_vars(tokens)
        listing = "ls ~/.hermes/cache/documents 2>/dev/null; echo --; ls ~/.hermes/skills"
        r = {{}}
        r["alice"] = turn("1", "[The user sent a document: 'contract draft.pdf'. It is saved at: {mine}]", listing)
        r["bob"] = turn("2", "what's the weather?", listing)
        # Bob sends his own later: it reaches his sandbox, still not Alice's.
        r["bob_later"] = turn("2", "[The user sent a document: 'payslip.pdf'. It is saved at: {theirs}]", listing)
        r["alice_later"] = turn("1", "thanks", listing)
        for key in list(tt._active_environments):
            cleanup_vm(key)
        r["log"] = _log.getvalue()
        finish(r)
    """)
    alice = result["alice"]["output"]
    assert "doc_0a1b2c3d4e5f_contract draft.pdf" in alice, alice
    assert "payslip" not in alice, alice
    assert "doc_" not in result["bob"]["output"].split("--")[0], result["bob"]
    assert "doc_f5e4d3c2b1a0_payslip.pdf" in result["bob_later"]["output"], result["bob_later"]
    assert "contract" not in result["bob_later"]["output"], result["bob_later"]
    assert "payslip" not in result["alice_later"]["output"], result["alice_later"]
    # The plugin's debug lines name the chat whose call they come from (issue 34).
    plugin_lines = [line for line in result["log"].splitlines() if line.startswith("hermes_e2b ")]
    for chat in ("1", "2"):
        task = f"task=session:agent:main:telegram:dm:{chat}"
        assert any(line.endswith(task) or f"{task} " in line for line in plugin_lines), \
            "\n".join(plugin_lines[-40:])
    # Skills are profile-wide by design: every chat's agent has them.
    for chat in ("alice", "bob"):
        assert "shared" in result[chat]["output"].split("--")[1], result[chat]


def test_skills_kept_out_of_chat_sandboxes_when_the_operator_says_so(home, e2b_local):
    # contract: X19 (`skills_in_chat_sandboxes: false`): no chat's sandbox gets the profile's
    # skills; the CLI's sandbox (no chat key) still does, and a skill a chat's agent writes is
    # still pulled back into the profile.
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}, skills_in_chat_sandboxes=False),
                      terminal={"timeout": 60})
    home.write_key()
    skill = home.path / "skills" / "shared" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("# profile-wide\n")
    result = run(home, """
        from gateway.session_context import clear_session_vars, set_session_vars
        from tools.terminal_tool_lifecycle import cleanup_vm
        def turn(chat, command):
            tokens = set_session_vars(platform="telegram", chat_id=chat, session_key=f"agent:main:telegram:dm:{chat}")
            try:
                return T(command, task_id=f"turn-{chat}")
            finally:
                clear_session_vars(tokens)
        r = {}
        r["chat"] = turn("1", "ls -R ~/.hermes/skills 2>&1; mkdir -p ~/.hermes/skills/mine && echo learned > ~/.hermes/skills/mine/SKILL.md")
        r["cli"] = T("ls -R ~/.hermes/skills 2>&1", task_id="cli-task")
        for key in list(tt._active_environments):
            cleanup_vm(key)
        finish(r)
    """)
    assert "SKILL.md" not in result["chat"]["output"], result["chat"]
    assert "shared" not in result["chat"]["output"], result["chat"]
    assert "shared" in result["cli"]["output"], result["cli"]
    assert (home.path / "skills" / "mine" / "SKILL.md").read_text() == "learned\n"
