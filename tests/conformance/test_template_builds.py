"""Template builds through the official SDK's `Template` against e2b-local (contract L22):
`Template.build` with COPY (globs, symlinks), RUN, ENV, WORKDIR and USER steps, its log
callback and its errors; a sandbox of the built template with the build's files, working
directory and start command; a build in the background and its status; `Template.exists`;
tags (assign, list, create by tag, remove). Both pinned SDKs have `Template`; an SDK
without it skips."""

import os
import shutil
import tempfile

import pytest

from conftest import wait_for


def template_api():
    try:
        from e2b import Template
        from e2b.exceptions import BuildException
    except ImportError as error:
        import e2b

        version = getattr(e2b, "__version__", "this version")
        pytest.skip(f"the installed e2b ({version}) has no Template API: {error}")
    return Template, BuildException


@pytest.fixture
def context_dir():
    """A build context: folder/test.txt, a relative and a dangling symlink beside it."""
    path = tempfile.mkdtemp(prefix="e2b-template-context-")
    folder = os.path.join(path, "folder")
    os.makedirs(folder)
    with open(os.path.join(folder, "test.txt"), "w") as f:
        f.write("This is a test file.")
    os.symlink("test.txt", os.path.join(folder, "symlink.txt"))
    os.symlink("12345test.txt", os.path.join(folder, "dangling.txt"))
    with open(os.path.join(path, "app.py"), "w") as f:
        f.write("print('app')\n")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_build_runs_the_steps_and_sandboxes_start_from_the_result(server, unique, context_dir):
    Template, _ = template_api()
    from e2b import Sandbox

    name = f"tpl-{unique}:v1"
    template = (
        Template(file_context_path=context_dir)
        .from_base_image()
        .copy("folder/*", "folder")
        .copy("app.py", "/home/user/code/", mode=0o755)
        .run_cmd("cat folder/test.txt")
        .set_envs({"GREETING": "hi from $HOME"})
        .run_cmd('echo "$GREETING" > greeting.txt')
        .make_dir("/home/user/work")
        .set_workdir("/home/user/work")
        .run_cmd("pwd > where.txt; whoami >> where.txt")
        .run_cmd("whoami > /home/user/root-was-here", user="root")
    )
    logs = []
    info = Template.build(template, name, on_build_logs=logs.append)
    assert info.template_id and info.build_id
    messages = [entry.message for entry in logs]
    # The step's own output reaches the SDK's log callback.
    assert "This is a test file." in messages, messages
    assert any("[builder 5/" in m for m in messages), messages

    sbx = Sandbox.create(name, timeout=120)
    try:
        files = sbx.files
        assert files.read("/home/user/folder/test.txt") == "This is a test file."
        # Symlinks stay links, dangling ones too; the glob copied the folder's children.
        link = sbx.commands.run("readlink /home/user/folder/symlink.txt; readlink /home/user/folder/dangling.txt")
        assert link.stdout.split() == ["test.txt", "12345test.txt"]
        assert files.read("/home/user/folder/symlink.txt") == "This is a test file."
        app = sbx.commands.run("stat -c '%a %U' /home/user/code/app.py")
        assert app.stdout.strip() == "755 user"
        # ENV values are expanded by the build's shell.
        assert files.read("/home/user/greeting.txt").strip() == "hi from /home/user"
        assert files.read("/home/user/work/where.txt").split() == ["/home/user/work", "user"]
        assert files.read("/home/user/root-was-here").strip() == "root"
        # The build's last WORKDIR is where commands start.
        assert sbx.commands.run("pwd").stdout.strip() == "/home/user/work"
    finally:
        sbx.kill()


def test_a_failing_step_fails_the_build_naming_it(server, unique):
    Template, BuildException = template_api()
    failing = Template().from_base_image().run_cmd("echo before").run_cmd("echo oops >&2; exit 3")
    logs = []
    with pytest.raises(BuildException) as raised:
        Template.build(failing, f"fail-{unique}", on_build_logs=logs.append)
    assert "failed to run command 'echo oops >&2; exit 3'" in str(raised.value)
    assert "exit status 3" in str(raised.value)
    assert "oops" in [entry.message for entry in logs]
    bad_user = Template().from_base_image().run_cmd("whoami", user="root123")
    with pytest.raises(BuildException) as raised:
        Template.build(bad_user, f"fail-user-{unique}")
    assert "failed to run command 'whoami': command failed: unauthenticated: invalid username: 'root123'" in str(
        raised.value
    )
    # A failed build files nothing.
    assert Template.exists(f"fail-{unique}") is False


@pytest.mark.skipif(os.geteuid() != 0, reason="a root layer needs mount and PID namespaces (root)")
def test_steps_write_to_a_layer_of_their_own_which_the_templates_sandboxes_carry(server, unique):
    # contract: L22 — what a build's steps write outside the home and /tmp lands in the
    # build's root layer, never on the host; each sandbox of the template starts with a copy
    # of it, writes to its own, and keeps it through a snapshot.
    Template, _ = template_api()
    from e2b import Sandbox

    installed = f"/usr/local/e2b-local-layer-{unique}"
    host_file = f"/var/tmp/e2b-local-host-file-{unique}"
    workdir = f"/app-{unique}"
    with open(host_file, "w") as f:
        f.write("the host's\n")
    try:
        template = (
            Template()
            .from_image("ubuntu:22.04")
            .run_cmd(f"mkdir -p {installed} && echo layered > {installed}/f && rm {host_file}", user="root")
            .set_workdir(workdir)
            .run_cmd("pwd > where.txt")
        )
        logs = []
        Template.build(template, f"layer-{unique}", on_build_logs=logs.append)
        # The image is not pulled, and the log says so.
        assert any("pulls no images" in entry.message for entry in logs)
        # The host saw none of it.
        assert not os.path.exists(installed)
        assert not os.path.exists(workdir)
        with open(host_file) as f:
            assert f.read() == "the host's\n"

        first = Sandbox.create(f"layer-{unique}", timeout=120)
        second = Sandbox.create(f"layer-{unique}", timeout=120)
        try:
            run = lambda sbx, cmd, **kw: sbx.commands.run(cmd, **kw).stdout.strip()
            assert run(first, f"cat {installed}/f") == "layered"
            assert run(first, "pwd; cat where.txt").split() == [workdir, workdir]
            assert run(first, f"test -e {host_file} && echo there || echo deleted") == "deleted"
            # Each sandbox has a layer of its own.
            first.commands.run(f"echo first > {installed}/mine", user="root")
            assert run(second, f"cat {installed}/mine 2>/dev/null || echo absent") == "absent"
            assert not os.path.exists(f"{installed}/mine")
            # A sandbox of the base template sees the host as it is.
            with Sandbox.create(timeout=60) as base:
                assert run(base, f"test -e {installed} && echo there || echo absent") == "absent"
                assert run(base, f"cat {host_file}") == "the host's"
            if hasattr(Sandbox, "create_snapshot"):
                snapshot = first.create_snapshot()
                try:
                    with Sandbox.create(snapshot.snapshot_id, timeout=60) as copy:
                        assert run(copy, f"cat {installed}/mine") == "first"
                        assert run(copy, f"test -e {host_file} && echo there || echo deleted") == "deleted"
                finally:
                    Sandbox.delete_snapshot(snapshot.snapshot_id)
        finally:
            first.kill()
            second.kill()
    finally:
        os.remove(host_file)


def test_start_command_runs_in_each_sandbox_of_the_template(server, unique):
    Template, _ = template_api()
    from e2b import Sandbox, wait_for_file

    name = f"start-{unique}"
    template = (
        Template()
        .from_base_image()
        .set_start_cmd(
            "cat /proc/sys/kernel/random/boot_id > /tmp/started-by.part"
            " && mv /tmp/started-by.part /tmp/started-by && sleep 600",
            wait_for_file("/tmp/started-by"),
        )
    )
    Template.build(template, name)
    sbx = Sandbox.create(name, timeout=120)
    try:
        boot_id = sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
        # Ready when the create answers, and started in this sandbox, not the build's.
        assert sbx.files.read("/tmp/started-by").strip() == boot_id
        listed = [p.cmd + " " + " ".join(p.args) for p in sbx.commands.list()]
        assert any("sleep 600" in p for p in listed), listed
    finally:
        sbx.kill()


def test_background_build_status_exists_and_tags(server, unique):
    Template, _ = template_api()
    from e2b import Sandbox
    from e2b.exceptions import TemplateException

    # The step waits for a file on the host (readable, as the host's system is): the
    # test decides when the build may finish, so "building" is seen for certain.
    gate = tempfile.mkdtemp(prefix="e2b-build-gate-", dir="/var/tmp")
    os.chmod(gate, 0o755)  # the step runs as the sandbox's user
    try:
        alias = f"bg-{unique}"
        template = (
            Template()
            .from_template("base")
            .run_cmd(f"while [ ! -e {gate}/go ]; do sleep 0.05; done; echo built > built.txt")
        )
        before = {s.sandbox_id for s in Sandbox.list().next_items()}
        info = Template.build_in_background(template, f"{alias}:v1", cpu_count=1, memory_mb=1024)
        wait_for(
            lambda: Template.get_build_status(info).status.value == "building",
            "the background build to start",
        )
        assert Template.exists(alias) is False
        # The build's sandbox is the server's, never in the team's list.
        assert {s.sandbox_id for s in Sandbox.list().next_items()} == before
        open(os.path.join(gate, "go"), "w").close()
        wait_for(
            lambda: Template.get_build_status(info).status.value == "ready",
            "the background build to be ready",
            timeout=120,
        )
    finally:
        shutil.rmtree(gate, ignore_errors=True)
    assert Template.exists(alias) is True
    assert Template.exists(f"{alias}:v1") is True
    assert Template.exists(f"{alias}:v2") is False
    assert Template.exists(f"nonexistent-{unique}") is False
    assert Template.exists("base") is True

    tagged = Template.assign_tags(f"{alias}:v1", ["production", "latest"])
    assert sorted(tagged.tags) == ["latest", "production"]
    assert tagged.build_id == info.build_id
    tags = {t.tag: t.build_id for t in Template.get_tags(alias)}
    assert tags == {"v1": info.build_id, "production": info.build_id, "latest": info.build_id}
    sbx = Sandbox.create(f"{alias}:production", timeout=60)
    try:
        assert sbx.files.read("/home/user/built.txt").strip() == "built"
    finally:
        sbx.kill()
    Template.remove_tags(alias, "production")
    assert {t.tag for t in Template.get_tags(alias)} == {"v1", "latest"}
    # Removing one tag keeps the build the others point at.
    sbx = Sandbox.create(f"{alias}:latest", timeout=60)
    sbx.kill()
    with pytest.raises(Exception):
        Template.assign_tags(f"{alias}:v1", ":invalid-tag")
    with pytest.raises(TemplateException):
        Template.get_tags(f"nonexistent-{unique}")
