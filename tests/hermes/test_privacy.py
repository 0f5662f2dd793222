"""What of the host's Hermes home reaches the sandbox, through a real Hermes: the README's
"What leaves your machine" section against Hermes' own sync list and the plugin's table."""

from __future__ import annotations

import json
import re
import uuid

from conftest import REPO
from test_environment import run


def readme_block(name: str) -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split(f"<!-- privacy:{name} -->", 1)[1].split(f"<!-- /privacy:{name} -->", 1)[0]


def test_the_readme_names_hermes_cache_directories(home):
    # The uploaded cache directories the README lists are those of Hermes' own table.
    listed = [re.sub(r"\s+", " ", p) for p in re.findall(r"`([^`]+)`", readme_block("cache"))]
    hermes = home.driver(
        """
        import json
        import tools.credential_files as c
        print("RESULT:" + json.dumps([new for new, _old in c._CACHE_DIRS]))
        """
    )
    assert listed == hermes


def test_secrets_registered_for_upload_stay_on_the_host(home, e2b_local):
    # contract: X7 — `terminal.credential_files` registers .env, auth.json and an ordinary
    # credential file; Hermes offers all three for upload. Only the ordinary one, the skill
    # and the cache file reach the sandbox; the others are named in a warning.
    tag = uuid.uuid4().hex
    home.write_config(settings=e2b_local.settings(metadata={"test": tag}),
                      terminal={"timeout": 60, "credential_files": [".env", "auth.json", "tool-token.json"]})
    home.write_key()
    (home.path / "auth.json").write_text('{"provider": "secret-login"}')
    (home.path / "tool-token.json").write_text('{"token": "for-the-sandbox"}')
    (home.path / "skills" / "demo").mkdir(parents=True)
    (home.path / "skills" / "demo" / "SKILL.md").write_text("# demo\n")
    (home.path / "cache" / "documents").mkdir(parents=True)
    (home.path / "cache" / "documents" / "brief.txt").write_text("brief\n")
    (home.path / "memories").mkdir()
    (home.path / "memories" / "MEMORY.md").write_text("host memory\n")
    (home.path / "sessions").mkdir()
    (home.path / "sessions" / "s1.json").write_text("{}")
    result = run(home, """
        from tools.environments.file_sync import iter_sync_files
        offered = sorted(host.rsplit("/hermes-home/", 1)[1] for host, _ in iter_sync_files("/x"))
        r = T("cd ~/.hermes && find . -type f | sed 's|^./||' | sort")
        from tools.terminal_tool_lifecycle import cleanup_vm
        cleanup_vm("t1")
        finish({"offered": offered, "listing": r["output"]})
    """, timeout=300)
    offered, listing = result["offered"], result["listing"].split()
    # Hermes itself offers the secrets: the plugin's table is what keeps them home.
    assert ".env" in offered and "auth.json" in offered, offered
    for kept in (".env", "auth.json", "config.yaml", "sessions/s1.json", "memories/MEMORY.md"):
        assert kept not in listing, (kept, listing)
    for sent in ("tool-token.json", "skills/demo/SKILL.md", "cache/documents/brief.txt"):
        assert sent in listing, (sent, listing)


def test_the_warning_names_the_file_kept_home(home, e2b_local):
    # contract: X7 — the drop is said, with the file and why.
    home.write_config(settings=e2b_local.settings(), terminal={"timeout": 60, "credential_files": [".env"]})
    home.write_key()
    out = home.driver(
        __import__("test_environment").PRELUDE + """
r = T("true")
from tools.terminal_tool_lifecycle import cleanup_vm
cleanup_vm("t1")
finish(r)
""")
    assert re.search(r"not uploading \S*/\.env \(to \S*/\.hermes/\.env\): \.env \(the profile's secrets, the E2B API key among them\) "
                     r"never leaves this host", out["log"]), out["log"][-3000:]
    assert json.dumps(out["result"])
