"""Delegated children each in a fork of the parent's sandbox (contract R15), through Hermes'
own agent loop: `hermes chat -q` against the scripted model, whose parent script calls
`delegate_task` with two children whose goals carry their own markers (so each child runs
its own script), against e2b-local."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from agent_harness import NetGuard, agent_config, hermes_chat, write_agent_config
from scripted_model import Dynamic, Reply, ToolCall, scripted_model  # noqa: F401 - fixture
from test_cli import e2b
from test_environment import run, sandboxes

PROJECT = "/home/user/proj"
PLAIN = "/home/user/plain"


@pytest.fixture
def guard(tmp_path: Path) -> NetGuard:
    return NetGuard(tmp_path / "netguard")


def child_script(name: str, directory: str, git: bool) -> list:
    """A child that writes the same paths as its sibling, starts a server on the same port,
    and leaves work for its parent."""
    commit = (f" && git -c user.email=c@x -c user.name=c commit -qam 'child {name}'" if git else "")
    return [
        ToolCall("terminal", {"command": f"cd {directory} && echo {name} > /tmp/who && echo {name} >> shared.txt"
                                         f"{commit} && echo {name}-new > {name}.txt && echo written"}),
        ToolCall("terminal", {"command": "python3 -m http.server 8765", "background": True}),
        ToolCall("terminal", {"command": "for i in $(seq 50); do python3 -c \"import urllib.request as u; "
                                         "u.urlopen('http://127.0.0.1:8765/')\" 2>/dev/null && break; sleep 0.2; "
                                         "done && echo serving && cat /tmp/who"}),
        Reply(f"child {name} done"),
    ]


def delegate(marker_a: str, marker_b: str) -> ToolCall:
    return ToolCall("delegate_task", {"tasks": [
        {"goal": f"Run your scripted steps {marker_a}"},
        {"goal": f"Run your scripted steps {marker_b}"},
    ]})


def run_parent(home, e2b_local, scripted_model, guard, tag, *, subagents: str, setup: str, directory: str,  # noqa: F811
               git: bool, extra: dict | None = None, plugin: dict | None = None):
    marker = f"PARENT-{tag[:10]}"
    marker_a, marker_b = f"CHILDA-{tag[:10]}", f"CHILDB-{tag[:10]}"
    scripted_model.register(marker_a, child_script("a", directory, git))
    scripted_model.register(marker_b, child_script("b", directory, git))
    scripted_model.register(marker, [
        ToolCall("terminal", {"command": setup}),
        delegate(marker_a, marker_b),
        ToolCall("terminal", {"command": f"cd {directory} && cat /tmp/who 2>/dev/null; cat shared.txt; ls; "
                                         f"cat shared.txt.hermes-subagent-* 2>/dev/null; true"}),
        Reply(f"parent done {marker}"),
    ])
    settings = e2b_local.settings(metadata={"test": tag}, **({"subagents": subagents} if subagents else {}),
                                  **(plugin or {}))
    write_agent_config(home, agent_config(scripted_model, settings, extra=extra))
    home.write_key()
    proc = hermes_chat(home, guard, f"Please run the scripted steps {marker}", timeout=300)
    assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert f"parent done {marker}" in proc.stdout
    return marker, marker_a, marker_b


# contract: R15
def test_two_children_in_a_git_work_tree_work_in_forks_and_come_back_as_branches(home, e2b_local, scripted_model,  # noqa: F811
                                                                                 guard):
    tag = uuid.uuid4().hex
    setup = (f"mkdir -p {PROJECT} && cd {PROJECT} && git init -q -b main && git config user.email p@x && "
             f"git config user.name p && echo base > shared.txt && git add . && git commit -qm base && echo ready")
    marker, marker_a, marker_b = run_parent(home, e2b_local, scripted_model, guard, tag, subagents="fork",
                                            setup=setup, directory=PROJECT, git=True)
    # Each child saw only its own write, and both servers started on the same port.
    for name, child in (("a", marker_a), ("b", marker_b)):
        result = scripted_model.tool_result(child, 2)
        assert result["exit_code"] == 0, result
        assert result["output"].splitlines()[-2:] == ["serving", name], result
    # The delegate_task result the parent's model read says what came back.
    delegated = scripted_model.tool_result(marker, 1)
    reports = {r["subagent"]: r for r in delegated["subagent_sandboxes"]}
    assert len(reports) == 2, delegated
    for report in reports.values():
        assert report["branch"].startswith("hermes-subagent/"), report
        assert "merge it" in report["came_back"], report
    # The parent's own tree is as it was (no child's /tmp/who, shared.txt untouched); its
    # repository has both branches.
    after = scripted_model.tool_result(marker, 2)["output"].splitlines()
    assert after == ["base", "shared.txt"], after
    # A later process of the profile reads each branch: the child's commit, the commit of its
    # uncommitted work, and its line in shared.txt.
    for report in sorted(reports.values(), key=lambda r: r["subagent"]):
        name = "a" if report["subagent"].startswith("sa-0") else "b"
        shown = run(home, f"""
            r = T("cd {PROJECT} && git log --format=%s main..{report['branch']} && "
                  "git show {report['branch']}:shared.txt && git show {report['branch']}:{name}.txt")
            finish(r)
        """)
        assert shown["output"].splitlines() == [
            f"hermes-subagent {report['subagent']}: work left uncommitted", f"child {name}",
            "base", name, f"{name}-new"], shown
    # No fork is left running or paused.
    left = [s for s in sandboxes(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")]
    assert left == [], left
    doctor = e2b(home, "doctor").stdout
    assert "E2B subagents: fork: each delegated child works in its own fork" in doctor, doctor


# contract: R15
def test_outside_git_both_childrens_files_come_back_and_a_conflict_is_kept_beside(home, e2b_local,  # noqa: F811
                                                                                  scripted_model, guard):
    tag = uuid.uuid4().hex
    setup = f"mkdir -p {PLAIN} && cd {PLAIN} && echo base > shared.txt && echo ready"
    marker, marker_a, marker_b = run_parent(home, e2b_local, scripted_model, guard, tag, subagents="fork",
                                            setup=setup, directory=PLAIN, git=False)
    for name, child in (("a", marker_a), ("b", marker_b)):
        result = scripted_model.tool_result(child, 2)
        assert result["output"].splitlines()[-2:] == ["serving", name], result
    # Children come back in task order: the first one's shared.txt is applied (the parent had
    # not changed it); the second finds it changed, so its version is kept beside, and its
    # report, which the parent's model reads, says where.
    first, second = scripted_model.tool_result(marker, 1)["subagent_sandboxes"]
    assert (first["written"], first["conflicts"]) == ([f"{PLAIN}/a.txt", f"{PLAIN}/shared.txt"], []), first
    assert second["written"] == [f"{PLAIN}/b.txt"], second
    [conflict] = second["conflicts"]
    beside = f"shared.txt.hermes-subagent-{second['subagent']}"
    assert conflict == {"path": f"{PLAIN}/shared.txt", "subagent_version": f"{PLAIN}/{beside}"}, second
    assert beside in second["came_back"], second
    # Each child's /tmp/who is named, not copied.
    assert first["elsewhere"]["paths"] == ["/tmp/who"] == second["elsewhere"]["paths"], second
    assert "/tmp/who" in second["came_back"], second
    listing = scripted_model.tool_result(marker, 2)["output"].splitlines()
    assert listing == ["base", "a", "a.txt", "b.txt", "shared.txt", beside, "base", "b"], listing
    left = [s for s in sandboxes(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")]
    assert left == [], left


def whole_work_child(name: str) -> list:
    """A child whose working directory is the git repository ~/repo and who also works in a
    second repository, a plain directory under ~ (a file its sibling changes too) and /tmp."""
    git = "git -c user.email=c@x -c user.name=c"
    return [
        ToolCall("terminal", {"command": f"cd ~/repo && echo {name} >> README && {git} commit -qam 'repo {name}' && "
                                         f"cd ~/other && echo {name} > {name}.txt && "
                                         f"cd ~/plain && echo {name} > {name}.txt && echo {name} >> shared.txt && "
                                         f"echo {name} > /tmp/{name}-scratch.txt && echo done"}),
        Reply(f"child {name} done"),
    ]


# contract: R15
def test_a_childs_work_outside_its_working_directory_comes_back_and_the_rest_is_named(home, e2b_local,  # noqa: F811
                                                                                       scripted_model, guard):
    """Two children start in one git repository and each also writes in another repository,
    in a plain directory under the home (both change one file there) and in /tmp: each
    repository comes back as a branch per child, the plain files come back, the second
    child's version of the file both changed lands beside the first's, and each result names
    the /tmp write, which stays in the fork."""
    tag = uuid.uuid4().hex
    marker, marker_a, marker_b = f"PARENT-{tag[:10]}", f"CHILDA-{tag[:10]}", f"CHILDB-{tag[:10]}"
    scripted_model.register(marker_a, whole_work_child("a"))
    scripted_model.register(marker_b, whole_work_child("b"))
    setup = ("set -e; for r in repo other; do mkdir -p ~/$r && cd ~/$r && git init -q -b main && "
             "echo base > README && git add . && git -c user.email=p@x -c user.name=p commit -qm base; done; "
             "mkdir -p ~/plain && echo base > ~/plain/shared.txt && cd ~/repo && echo ready")
    scripted_model.register(marker, [
        ToolCall("terminal", {"command": setup}),
        delegate(marker_a, marker_b),
        ToolCall("terminal", {"command": "cd ~/plain && ls && cat shared.txt; ls /tmp | grep -c scratch; "
                                         "cd ~/other && git branch --format='%(refname:short)' | sort | tr '\\n' ' '"}),
        Reply(f"parent done {marker}"),
    ])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag},
                                                                             subagents="fork")))
    home.write_key()
    proc = hermes_chat(home, guard, f"Please run the scripted steps {marker}", timeout=300)
    assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    first, second = scripted_model.tool_result(marker, 1)["subagent_sandboxes"]
    for report, name in ((first, "a"), (second, "b")):
        repositories = sorted(b["repository"] for b in report["branches"])
        assert repositories == ["/home/user/other", "/home/user/repo"], report
        assert all(b["branch"] == f"hermes-subagent/{report['subagent']}" for b in report["branches"]), report
        assert report["elsewhere"]["paths"] == [f"/tmp/{name}-scratch.txt"], report
        assert f"/tmp/{name}-scratch.txt" in report["came_back"], report
        assert "/home/user" in report["compared"], report
    assert first["written"] == ["/home/user/plain/a.txt", "/home/user/plain/shared.txt"], first
    assert (second["written"], len(second["conflicts"])) == (["/home/user/plain/b.txt"], 1), second
    beside = f"shared.txt.hermes-subagent-{second['subagent']}"
    assert second["conflicts"] == [{"path": "/home/user/plain/shared.txt",
                                    "subagent_version": f"/home/user/plain/{beside}"}], second
    # In the parent's sandbox: the files, the first child's shared.txt (the parent's version
    # when the second came back: it stays), no scratch file, both branches in ~/other.
    seen = scripted_model.tool_result(marker, 2)["output"].split()
    assert seen == ["a.txt", "b.txt", "shared.txt", beside, "base", "a", "0", "hermes-subagent/" + first["subagent"],
                    "hermes-subagent/" + second["subagent"], "main"], seen
    left = [s for s in sandboxes(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")]
    assert left == [], left


# contract: R15
def test_hermes_worktree_isolation_selects_forks(home, e2b_local, scripted_model, guard):  # noqa: F811
    """No `subagents` setting, but Hermes' own `delegation.worktree_isolation: true`: the user
    asked for isolated children, so they get forks here too. With `subagent_forks: keep` each
    fork is paused and kept once its work is back, listed as its child's, with nothing left to
    recover."""
    tag = uuid.uuid4().hex
    setup = f"mkdir -p {PLAIN} && cd {PLAIN} && echo base > shared.txt && echo ready"
    marker, _, _ = run_parent(home, e2b_local, scripted_model, guard, tag, subagents="", setup=setup,
                              directory=PLAIN, git=False, extra={"delegation": {"worktree_isolation": True}},
                              plugin={"subagent_forks": "keep"})
    reports = scripted_model.tool_result(marker, 1).get("subagent_sandboxes")
    assert reports and len(reports) == 2, reports
    kept = {s["sandboxID"]: s for s in sandboxes(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")}
    assert len(kept) == 2 and {s["state"] for s in kept.values()} == {"paused"}, kept
    for report in reports:
        assert "is kept, paused (subagent_forks: keep)" in report["came_back"], report
    listed = [e for e in json.loads(e2b(home, "list", "--json").stdout) if e["sandbox_id"] in kept]
    assert len(listed) == 2 and not any(e["subagent_recoverable"] for e in listed), listed


# contract: R15
def test_shared_keeps_hermes_behaviour(home, e2b_local, scripted_model, guard):  # noqa: F811
    tag = uuid.uuid4().hex
    setup = f"mkdir -p {PLAIN} && cd {PLAIN} && echo base > shared.txt && echo ready"
    marker, marker_a, marker_b = run_parent(home, e2b_local, scripted_model, guard, tag, subagents="shared",
                                            setup=setup, directory=PLAIN, git=False)
    delegated = scripted_model.tool_result(marker, 1)
    assert "subagent_sandboxes" not in delegated, delegated
    # One sandbox for all, as Hermes has it: both children appended to the one shared.txt,
    # and the parent reads the last child's /tmp/who.
    shared = scripted_model.tool_result(marker, 2)["output"].splitlines()
    assert shared[0] in ("a", "b") and shared[1] == "base" and sorted(shared[2:4]) == ["a", "b"], shared
    assert shared[4:] == ["a.txt", "b.txt", "shared.txt"], shared
    assert len({s["sandboxID"] for s in sandboxes(e2b_local, tag)}) == 1


def start_a_child_that_sleeps(home, e2b_local, scripted_model, guard, tag):  # noqa: F811
    """Starts `hermes chat -q` (its own process group) whose parent delegates one child that
    writes `work.txt` in its fork, then runs `sleep 100`; returns once the child has been given
    its sleep (its file written): (the process, the parent's marker, the child's)."""
    import signal
    import subprocess
    import time

    from agent_harness import VENV_BIN

    marker, child_marker = f"PARENT-{tag[:10]}", f"CHILD-{tag[:10]}"
    scripted_model.register(child_marker, [
        # Its work outside the working directory too: a build directory its commands then run
        # in (compared once they have), and scratch space (named, not copied).
        ToolCall("terminal", {"command": f"cd {PLAIN} && echo partial > work.txt && echo s > /tmp/scratch.txt && "
                                         "mkdir -p /tmp/build && cd /tmp/build && echo obj > out.o"}),
        ToolCall("terminal", {"command": "sleep 100", "timeout": 150}),
        Reply("never"),
    ])
    scripted_model.register(marker, [
        ToolCall("terminal", {"command": f"mkdir -p {PLAIN} && echo \"$E2B_SANDBOX_ID\""}),
        ToolCall("delegate_task", {"tasks": [{"goal": f"Run your scripted steps {child_marker}"}]}),
        Reply("never"),
    ])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag}, subagents="fork")))
    home.write_key()
    proc = subprocess.Popen([str(VENV_BIN / "hermes"), "chat", "-q", f"Please run the scripted steps {marker}"],
                            env=home.env(guard.env()), cwd=home.path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and len(scripted_model.conversation(child_marker)) < 2:
        time.sleep(0.2)
    # Its sleep starts in /tmp/build: the host's record of the fork names the directory before
    # the command runs, so once it does, the sleep is (about to be) running there.
    records = home.path / "cache" / "e2b" / "subagents"

    def recorded():
        return any(b"/tmp/build" in r.read_bytes() for r in records.glob("*") if r.is_file())

    while time.monotonic() < deadline and proc.poll() is None and not (
            len(scripted_model.conversation(child_marker)) >= 2 and records.is_dir() and recorded()):
        time.sleep(0.1)
    if len(scripted_model.conversation(child_marker)) < 2 or not (records.is_dir() and recorded()):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise AssertionError("the child was not given its sleep in /tmp/build")
    return proc, marker, child_marker


# contract: R15
def test_a_hermes_killed_mid_child_leaves_a_listed_fork_that_no_session_adopts(home, e2b_local, scripted_model,  # noqa: F811
                                                                              guard):
    """Hermes is SIGKILLed while a child runs in its fork: `hermes e2b list` shows the fork as
    that child's, with its parent; `hermes e2b pull --subagent` brings its work back into the
    parent's sandbox and kills it; the next `hermes chat` works in the parent's sandbox, never
    the fork."""
    import signal

    from test_environment import sandboxes as listed

    tag = uuid.uuid4().hex
    proc, marker, _ = start_a_child_that_sleeps(home, e2b_local, scripted_model, guard, tag)
    try:
        # It runs in the fork when Hermes is killed, its sleep started in /tmp/build.
        fork = next((s for s in listed(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")), None)
        assert fork is not None, "the child's fork appeared"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    parent_id = scripted_model.tool_result(marker, 0)["output"].strip()
    # A lease bounds what the orphaned fork costs: E2B pauses it when its lease ends.
    import datetime
    import urllib.request

    request = urllib.request.Request(f"{e2b_local.api_url}/sandboxes/{fork['sandboxID']}",
                                     headers={"X-API-Key": "e2b_test_listing"})
    with urllib.request.urlopen(request, timeout=30) as response:
        detail = json.loads(response.read())
    assert detail["lifecycle"]["onTimeout"] == "pause", detail

    def at(text: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))

    assert (at(detail["endAt"]) - at(detail["startedAt"])).total_seconds() <= 3600, detail
    shown = e2b(home, "list", "--json")
    assert shown.returncode == 0, shown.stderr
    [entry] = [e for e in json.loads(shown.stdout) if e["sandbox_id"] == fork["sandboxID"]]
    assert entry["subagent"] == fork["metadata"]["hermes.subagent"], entry
    assert entry["subagent_of"] == parent_id, entry
    assert entry["duplicate_of"] is None, entry
    assert entry["subagent_recoverable"] is True, entry
    text = e2b(home, "list").stdout
    assert f"fork of {parent_id}: its work is not back, hermes e2b pull --subagent {fork['sandboxID']}" in text, text
    # The child's work is recovered into the parent's sandbox, and the fork is killed.
    pulled = e2b(home, "pull", "--subagent", fork["sandboxID"], "--json")
    assert pulled.returncode == 0, pulled.stderr
    back = json.loads(pulled.stdout)
    # The child's work under the home and in the directory its commands ran in comes back;
    # its scratch file is named.
    assert (back["written"], back["conflicts"]) == (["/home/user/plain/work.txt", "/tmp/build/out.o"], []), back
    assert back["elsewhere"]["paths"] == ["/tmp/scratch.txt"], back
    assert "/tmp/build" in back["compared"], back
    assert [s for s in listed(e2b_local, tag) if s["sandboxID"] == fork["sandboxID"]] == []
    again_pull = e2b(home, "pull", "--subagent", fork["sandboxID"])
    assert again_pull.returncode != 0 and "no record of a subagent fork" in again_pull.stderr, again_pull.stderr
    # The next session works in the parent's sandbox, not the fork, and finds the work there.
    again = f"AGAIN-{tag[:10]}"
    scripted_model.register(again, [ToolCall("terminal", {"command": f"echo \"$E2B_SANDBOX_ID\"; cat {PLAIN}/work.txt "
                                                                     "/tmp/build/out.o; test -e /tmp/scratch.txt || "
                                                                     "echo no-scratch"}),
                                    Reply("ok")])
    proc = hermes_chat(home, guard, f"Please run the scripted steps {again}")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert scripted_model.tool_result(again, 0)["output"].split() == [parent_id, "partial", "obj", "no-scratch"]


@pytest.fixture
def two_slots():
    """An e2b-local that runs at most two sandboxes at once: the parent's and one fork."""
    from conftest import LocalServer

    server = LocalServer("--max-running", "2")
    yield server
    server.stop()


# contract: R15 (L14: forks take slots like any sandbox)
def test_three_children_under_a_limit_of_two_all_come_back_and_a_failed_ones_work_too(home, two_slots,  # noqa: F811
                                                                                     scripted_model, guard):
    """Three parallel coding tasks on an account that runs two sandboxes: the parent keeps its
    slot, the forks take turns for the other (an idle sibling's fork is paused between its
    tool calls), and every child's work comes back, the one whose run failed included (Hermes
    reports it `failed`); the limit is never passed and no fork is left."""
    from test_gateway_restarts import RunningSampler

    tag = uuid.uuid4().hex
    marker = f"PARENT-{tag[:10]}"
    children = {name: f"CHILD{name.upper()}-{tag[:10]}" for name in ("a", "b", "c")}
    for name, child in children.items():
        # Child a also writes a skill in its fork's Hermes home.
        skill = (" && mkdir -p ~/.hermes/skills/from-a && echo 'a skill' > ~/.hermes/skills/from-a/SKILL.md"
                 if name == "a" else "")
        scripted_model.register(child, [
            ToolCall("terminal", {"command": f"cd {PLAIN} && echo {name} > /tmp/who && echo {name} > {name}.txt{skill}"}),
            ToolCall("terminal", {"command": f"cd {PLAIN} && cat /tmp/who && ls"}),
            # "(empty)" is what Hermes' loop answers when it gives up on a model: the child's
            # run is reported `failed`.
            Reply("(empty)" if name == "c" else f"child {name} done"),
        ])
    scripted_model.register(marker, [
        ToolCall("terminal", {"command": f"mkdir -p {PLAIN} && cd {PLAIN} && echo base > shared.txt"}),
        ToolCall("delegate_task", {"tasks": [{"goal": f"Run your scripted steps {c}"} for c in children.values()]}),
        ToolCall("terminal", {"command": f"cd {PLAIN} && ls && cat a.txt b.txt c.txt; cat /tmp/who 2>&1; true"}),
        Reply(f"parent done {marker}"),
    ])
    # `hermes chat -q` lets a one-shot run delegate two children unless told more.
    write_agent_config(home, agent_config(scripted_model, two_slots.settings(metadata={"test": tag}, subagents="fork"),
                                          extra={"delegation": {"oneshot_max_children": 3}}))
    home.write_key()
    sampler = RunningSampler(two_slots)
    sampler.start()
    try:
        proc = hermes_chat(home, guard, f"Please run the scripted steps {marker}", timeout=300)
    finally:
        sampler.stop()
    assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert f"parent done {marker}" in proc.stdout
    delegated = scripted_model.tool_result(marker, 1)
    # Each child read its own /tmp/who in its own fork.
    for name, child in children.items():
        assert scripted_model.tool_result(child, 1)["output"].splitlines()[0] == name, delegated
    reports = {r["subagent"]: r for r in delegated["subagent_sandboxes"]}
    assert len(reports) == 3, delegated
    statuses = sorted(r["status"] for r in reports.values())
    assert statuses == ["completed", "completed", "failed"], reports
    for report in reports.values():
        assert "written" in report, report
        assert len(report["written"]) == 1 and report["conflicts"] == [], report
    # The skill child a wrote came back with its work, and reached this host's Hermes home.
    skills = {os.path.basename(r["written"][0]): r["hermes_home"] for r in reports.values()}
    assert skills["a.txt"] == {"written": ["skills/from-a/SKILL.md"], "conflicts": []}, skills
    assert skills["b.txt"] == skills["c.txt"] == {"written": [], "conflicts": []}, skills
    assert (home.path / "skills" / "from-a" / "SKILL.md").read_text() == "a skill\n"
    after = scripted_model.tool_result(marker, 2)["output"].splitlines()
    assert after[:4] == ["a.txt", "b.txt", "c.txt", "shared.txt"], after
    assert after[4:7] == ["a", "b", "c"], after
    assert "No such file" in after[7], after
    assert sampler.highest <= 2, sampler.highest
    left = [s for s in sandboxes(two_slots, tag) if (s.get("metadata") or {}).get("hermes.subagent")]
    assert left == [], left


# contract: R15
def test_a_gateway_chats_detached_child_comes_back_and_its_report_reaches_the_next_turn(home, e2b_local,  # noqa: F811
                                                                                      scripted_model, guard):
    """A real `hermes gateway run`: a run of a chat delegates a child, and Hermes detaches it
    (the delegation returns at once; the child runs after the turn has ended). The child's work
    still comes back to the chat's sandbox when it ends, its fork is killed, and the chat's next
    turn tells the model what came back (its `delegate_task` result was read long before)."""
    import time

    from agent_harness import Gateway

    tag = uuid.uuid4().hex
    marker, child_marker, after = f"PARENT-{tag[:10]}", f"CHILDD-{tag[:10]}", f"AFTER-{tag[:10]}"
    scripted_model.register(child_marker, [
        ToolCall("terminal", {"command": f"cd {PLAIN} && echo detached > work.txt && echo written"}),
        Reply("child done"),
    ])
    scripted_model.register(marker, [
        ToolCall("terminal", {"command": f"mkdir -p {PLAIN} && echo ready"}),
        ToolCall("delegate_task", {"tasks": [{"goal": f"Run your scripted steps {child_marker}"}]}),
        Reply(f"delegated {marker}"),
    ])
    scripted_model.register(after, [
        ToolCall("terminal", {"command": f"cat {PLAIN}/work.txt"}),
        Reply(f"after {after}"),
    ])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag}, subagents="fork")))
    home.write_key()
    session = f"detached-{tag[:8]}"
    with Gateway(home, guard) as gateway:
        reply = gateway.chat(f"Please run the scripted steps {marker}", session_id=session)
        assert reply == f"delegated {marker}", gateway.tail()
        assert "subagent_sandboxes" not in scripted_model.tool_result(marker, 1), "the delegation was detached"

        def ended() -> list[str]:
            return [line for line in gateway.log_lines() if "hermes-e2b: subagent " in line and " ended (" in line]

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ended():
            time.sleep(0.2)
        [line] = {line.split("hermes-e2b: subagent ", 1)[-1] for line in ended()}
        assert "ended (completed)" in line and "1 written" in line, line
        reply = gateway.chat(f"Please run the scripted steps {after}", session_id=session)
        assert reply == f"after {after}", gateway.tail()
    assert scripted_model.tool_result(after, 0)["output"].strip() == "detached", [
        (s["sandboxID"], {k: v for k, v in (s.get("metadata") or {}).items() if k in ("hermes.task", "hermes.scope", "hermes.subagent", "hermes.branch", "hermes.session")}) for s in sandboxes(e2b_local, tag)]
    # The next turn's first model request carries what came back.
    [first, *_] = scripted_model.conversation(after)
    told = json.dumps(first["body"]["messages"])
    assert "Subagent sandboxes, since the delegation returned" in told and "work.txt" in told, told[-3000:]
    left = [s for s in sandboxes(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")]
    assert left == [], left


# contract: R15
def test_an_interrupted_childs_work_comes_back(home, e2b_local, scripted_model, guard):  # noqa: F811
    """Ctrl-C while a child's command runs in its fork: Hermes interrupts the child (its command
    is killed) and the parent; what the child wrote before comes back to the parent's sandbox,
    and its fork is killed."""
    import signal

    tag = uuid.uuid4().hex
    again = f"AGAIN-{tag[:10]}"
    proc, _, _ = start_a_child_that_sleeps(home, e2b_local, scripted_model, guard, tag)
    try:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    logs = "\n".join(p.read_text(errors="replace") for p in (home.path / "logs").glob("*.log"))
    ended = [line for line in logs.splitlines() if "hermes-e2b: subagent " in line and " ended (" in line]
    # Its file under the home and the one in the directory its sleep ran in.
    assert len(ended) == 1 and "ended (interrupted)" in ended[0] and "2 written" in ended[0], ended
    scripted_model.register(again, [ToolCall("terminal", {"command": f"cat {PLAIN}/work.txt /tmp/build/out.o"}),
                                    Reply("ok")])
    proc = hermes_chat(home, guard, f"Please run the scripted steps {again}")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert scripted_model.tool_result(again, 0)["output"].split() == ["partial", "obj"]
    left = [s for s in sandboxes(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")]
    assert left == [], left


# contract: R15
def test_a_grandchild_forks_from_its_parent_subagents_fork_and_its_work_comes_back_through_it(
        home, e2b_local, scripted_model, guard):  # noqa: F811
    """`delegation.max_spawn_depth: 2`: the parent's child delegates a grandchild of its own.
    The grandchild works in a fork of the child's fork (it sees the child's write, the
    child never sees its own before it comes back); its work comes back into the child's fork,
    and from there with the child's into the parent's sandbox. No fork is left."""
    tag = uuid.uuid4().hex
    marker, child, grandchild = f"PARENT-{tag[:10]}", f"CHILDN-{tag[:10]}", f"GRANDG-{tag[:10]}"
    scripted_model.register(grandchild, [
        ToolCall("terminal", {"command": f"cd {PLAIN} && cat c.txt && echo g > g.txt && echo $E2B_SANDBOX_ID"}),
        Reply("grandchild done"),
    ])
    scripted_model.register(child, [
        ToolCall("terminal", {"command": f"cd {PLAIN} && echo c > c.txt && echo $E2B_SANDBOX_ID"}),
        ToolCall("delegate_task", {"tasks": [{"goal": f"Run your scripted steps {grandchild}"}]}),
        ToolCall("terminal", {"command": f"cd {PLAIN} && ls"}),
        Reply("child done"),
    ])
    scripted_model.register(marker, [
        ToolCall("terminal", {"command": f"mkdir -p {PLAIN} && echo $E2B_SANDBOX_ID"}),
        ToolCall("delegate_task", {"tasks": [{"goal": f"Run your scripted steps {child}"}]}),
        ToolCall("terminal", {"command": f"cd {PLAIN} && ls"}),
        Reply(f"parent done {marker}"),
    ])
    write_agent_config(home, agent_config(scripted_model, e2b_local.settings(metadata={"test": tag}, subagents="fork"),
                                          extra={"delegation": {"max_spawn_depth": 2}}))
    home.write_key()
    proc = hermes_chat(home, guard, f"Please run the scripted steps {marker}", timeout=300)
    assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert f"parent done {marker}" in proc.stdout
    parent_id = scripted_model.tool_result(marker, 0)["output"].strip()
    child_id = scripted_model.tool_result(child, 0)["output"].splitlines()[-1]
    seen = scripted_model.tool_result(grandchild, 0)["output"].splitlines()
    # Three sandboxes: the grandchild's fork holds the child's write.
    assert seen[0] == "c" and len({parent_id, child_id, seen[1]}) == 3, (parent_id, child_id, seen)
    nested = scripted_model.tool_result(child, 1)
    [report] = nested["subagent_sandboxes"]
    # The grandchild worked where its parent subagent stood (it had cd'd into the directory).
    assert report["written"] == [f"{PLAIN}/g.txt"], report
    assert scripted_model.tool_result(child, 2)["output"].split() == ["c.txt", "g.txt"]
    assert scripted_model.tool_result(marker, 2)["output"].split() == ["c.txt", "g.txt"]
    left = [s for s in sandboxes(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")]
    assert left == [], left


# contract: R15 (L14: a bounded wait, never a deadlock)
def test_with_no_slot_for_a_fork_the_child_works_in_the_parents_sandbox_and_says_so(home, scripted_model,  # noqa: F811
                                                                                  guard):
    """An account that runs one sandbox: the parent holds the slot (its delegate_task waits
    for the child), so the child's fork cannot start within `slot_wait_seconds`. The child
    then works in the parent's sandbox, and its report says why; nothing waits forever."""
    from conftest import LocalServer

    server = LocalServer("--max-running", "1")
    try:
        tag = uuid.uuid4().hex
        marker, child = f"PARENT-{tag[:10]}", f"CHILDS-{tag[:10]}"
        scripted_model.register(child, [
            ToolCall("terminal", {"command": f"cd {PLAIN} && echo s > s.txt && echo $E2B_SANDBOX_ID"}),
            Reply("child done"),
        ])
        scripted_model.register(marker, [
            ToolCall("terminal", {"command": f"mkdir -p {PLAIN} && echo $E2B_SANDBOX_ID"}),
            ToolCall("delegate_task", {"tasks": [{"goal": f"Run your scripted steps {child}"}]}),
            ToolCall("terminal", {"command": f"cat {PLAIN}/s.txt"}),
            Reply(f"parent done {marker}"),
        ])
        settings = server.settings(metadata={"test": tag}, subagents="fork", slot_wait_seconds=2)
        write_agent_config(home, agent_config(scripted_model, settings))
        home.write_key()
        proc = hermes_chat(home, guard, f"Please run the scripted steps {marker}", timeout=300)
        assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}"
        assert f"parent done {marker}" in proc.stdout
        parent_id = scripted_model.tool_result(marker, 0)["output"].strip()
        assert scripted_model.tool_result(child, 0)["output"].strip() == parent_id
        [report] = scripted_model.tool_result(marker, 1)["subagent_sandboxes"]
        assert "had no fork" in report["came_back"] and "worked in the parent's sandbox" in report["came_back"], report
        assert scripted_model.tool_result(marker, 2)["output"].strip() == "s"
        assert [s for s in sandboxes(server, tag) if (s.get("metadata") or {}).get("hermes.subagent")] == []
    finally:
        server.stop()


def _handoff_of(results):
    """The session id of the process the child handed off, as the delegate_task result says."""
    for result in results:
        if isinstance(result, dict):
            for report in result.get("subagent_sandboxes") or []:
                for handed in report.get("handed_off") or []:
                    return handed["session_id"]
            for entry in result.get("results") or []:
                for handed in entry.get("handed_off_processes") or []:
                    return handed["session_id"]
    raise AssertionError(f"no handed-off process in {results}")


@pytest.mark.parametrize(("subagents", "parent_kills"), [("fork", True), ("fork", False), ("shared", True)])
def test_a_process_a_child_hands_off_keeps_working_for_the_parent(home, e2b_local, scripted_model, guard,  # noqa: F811
                                                                 subagents, parent_kills):
    """The child starts a web server in the background and hands it off (`process_manage
    handoff`): the parent's own sandbox reaches its port, `process_manage` polls and kills the
    real process, as with `subagents: shared`; with forks the child's fork runs on for it and
    ends with it (killed by the parent, or with the parent's session). Nothing is left."""
    # contract: R16
    from test_live_tools import process_call, unwrap

    tag = uuid.uuid4().hex
    marker, child = f"PARENT-{tag[:10]}", f"CHILDH-{tag[:10]}"
    site = f"{PLAIN}/site-{tag[:6]}"
    fetch = ("python3 -c \"import urllib.request as u; "
             "print(u.urlopen('http://localhost:8766/', timeout=20).read().decode().strip())\"")
    scripted_model.register(child, [
        ToolCall("terminal", {"command": f"mkdir -p {site} && echo child-page > {site}/index.html && echo ok"}),
        ToolCall("terminal", {"command": f"cd {site} && exec python3 -m http.server 8766 --bind 127.0.0.1",
                              "background": True}),
        ToolCall("terminal", {"command": f"for i in $(seq 100); do {fetch} 2>/dev/null && break; sleep 0.1; done"}),
        Dynamic(lambda r: process_call(action="handoff", session_id=[x for x in r if isinstance(x, dict)
                                                                     and x.get("session_id")][0]["session_id"],
                                       data="serves the child's page on port 8766")),
        Reply("child done"),
    ])
    steps = [
        ToolCall("terminal", {"command": f"mkdir -p {PLAIN} && echo ready"}),
        ToolCall("delegate_task", {"tasks": [{"goal": f"Run your scripted steps {child}"}]}),
        ToolCall("terminal", {"command": fetch}),
        Dynamic(lambda r: process_call(action="poll", session_id=_handoff_of(r))),
    ]
    if parent_kills:
        steps += [Dynamic(lambda r: process_call(action="kill", session_id=_handoff_of(r))),
                  Dynamic(lambda r: process_call(action="wait", session_id=_handoff_of(r), timeout=30))]
    scripted_model.register(marker, steps + [Reply(f"parent done {marker}")])
    write_agent_config(home, agent_config(scripted_model,
                                          e2b_local.settings(metadata={"test": tag}, subagents=subagents)))
    home.write_key()
    proc = hermes_chat(home, guard, f"Please run the scripted steps {marker}", timeout=300)
    assert proc.returncode == 0, f"rc {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert f"parent done {marker}" in proc.stdout
    handoff = unwrap(scripted_model.tool_result(child, 3))
    assert handoff.get("status") == "handed_off", handoff
    delegated = scripted_model.tool_result(marker, 1)
    if subagents == "fork":
        [report] = delegated["subagent_sandboxes"]
        [handed] = report["handed_off"]
        assert handed["ports"] == [{"port": 8766, "reachable": True}], report
        assert "keeps running the process(es) it handed off" in report["came_back"], report
    # The parent's sandbox reaches the child's server, and process_manage the real process.
    assert scripted_model.tool_result(marker, 2)["output"].strip() == "child-page"
    polled = unwrap(scripted_model.tool_result(marker, 3))
    assert polled["status"] == "running", polled
    if parent_kills:
        waited = unwrap(scripted_model.tool_result(marker, 5))
        assert waited["status"] in ("exited", "killed"), waited
    # Nothing is left: no fork, no server.
    left = [s for s in sandboxes(e2b_local, tag) if (s.get("metadata") or {}).get("hermes.subagent")]
    assert left == [], left
    records = home.path / "cache" / "e2b" / "subagents"
    assert not (records.exists() and list(records.glob("*.held"))), list(records.iterdir())
    after = run(home, f"r = T({fetch!r} + ' || echo refused'); finish(r)")
    assert after["output"].strip().endswith("refused"), after
