"""The official code-interpreter SDK (`e2b-code-interpreter`) against e2b-local's service on
port 49999: cells, state, streamed output, rich results, contexts, languages, interrupts,
and what happens to a cell when its sandbox pauses or dies.

contract: O11 (each test below names the part it checks)."""

import base64
import json
import shutil
import threading
import urllib.error
import urllib.request

import pytest
from e2b import InvalidArgumentException, NotFoundException, TimeoutException
from e2b_code_interpreter import Sandbox


@pytest.fixture
def interpreter(server):
    sbx = Sandbox.create(timeout=300)
    yield sbx
    Sandbox.kill(sbx.sandbox_id)


def test_a_cell_keeps_its_state_and_shows_its_last_expression(interpreter):
    # contract: O11 — the default python context keeps state; the last expression is the result.
    assert interpreter.run_code("x = 40").text is None
    execution = interpreter.run_code("x += 2; x")
    assert execution.text == "42"
    assert execution.results[0].is_main_result
    assert interpreter.run_code("'a string'").text == "a string"
    assert interpreter.run_code("x;").results == []


def test_output_streams_to_the_callbacks_while_the_cell_runs(interpreter, tmp_path):
    # contract: O11 — stdout reaches on_stdout before the cell ends: the cell waits for a
    # file that the callback writes, so it could not end if output came only at the end.
    seen = []

    def on_stdout(message):
        seen.append(message.line)
        if message.line == "waiting\n":
            interpreter.files.write("/home/user/go", "go")

    execution = interpreter.run_code(
        "import os, sys, time\n"
        "print('waiting')\n"
        "deadline = time.monotonic() + 60\n"
        "while not os.path.exists('/home/user/go'):\n"
        "    assert time.monotonic() < deadline, 'the callback never ran'\n"
        "    time.sleep(0.02)\n"
        "print('done'); print('oops', file=sys.stderr)\n",
        on_stdout=on_stdout,
    )
    assert execution.error is None, execution.error
    assert seen == ["waiting\n", "done\n"]
    assert execution.logs.stdout == ["waiting\n", "done\n"]
    assert execution.logs.stderr == ["oops\n"]


def test_subprocess_output_and_shell_lines_are_the_cells_output(interpreter):
    # contract: O11 — `!command`, os.system and subprocesses write into the cell's stdout.
    execution = interpreter.run_code("!pwd\nimport os\n_ = os.system('echo from-system')")
    assert "".join(execution.logs.stdout) == "/home/user\nfrom-system\n"


def test_an_error_names_the_exception_and_counts_as_an_execution(interpreter):
    # contract: O11 — errors: name, value, traceback; execution_count counts every cell.
    errors = []
    first = interpreter.run_code("undefined_name", on_error=errors.append)
    assert first.error.name == "NameError"
    assert first.error.value == "name 'undefined_name' is not defined"
    assert "undefined_name" in first.error.traceback
    assert errors and errors[0].name == "NameError"
    syntax = interpreter.run_code("def broken(:")
    assert syntax.error.name == "SyntaxError"
    assert interpreter.run_code("1").execution_count == syntax.execution_count + 1


def test_rich_results_carry_every_format_the_object_has(interpreter):
    # contract: O11 — display() and the _repr_*_ methods give html, markdown, svg, png,
    # latex, json; a raw MIME bundle is shown as given; unknown MIME types land in extra.
    execution = interpreter.run_code(
        "from IPython.display import display, HTML, Markdown, SVG\n"
        "import base64\n"
        "class Picture:\n"
        "    def _repr_png_(self):\n"
        "        return b'\\x89PNG fake'\n"
        "display(HTML('<b>bold</b>'), Markdown('*it*'))\n"
        "display({'text/latex': '$x$', 'application/x-custom': 'c'}, raw=True)\n"
        "display(SVG('<svg/>'))\n"
        "display(Picture())\n"
        "{'k': [1, 2]}\n"
    )
    assert execution.error is None, execution.error
    html, markdown, raw, svg, picture, main = execution.results
    assert html.html == "<b>bold</b>" and not html.is_main_result
    assert markdown.markdown == "*it*"
    assert raw.latex == "$x$" and raw.extra == {"application/x-custom": "c"}
    assert raw.formats() == ["latex", "application/x-custom"]
    assert svg.svg == "<svg/>"
    assert base64.b64decode(picture.png) == b"\x89PNG fake"
    assert main.is_main_result and main.json == {"k": [1, 2]}


def test_contexts_are_independent_and_can_be_restarted_and_removed(interpreter):
    # contract: O11 — create (with cwd), list in creation order, restart (state gone),
    # remove (404 afterwards); the default python and javascript contexts come first.
    interpreter.run_code("shared = 1")
    context = interpreter.create_code_context(cwd="/tmp")
    assert context.language == "python" and context.cwd == "/tmp"
    listed = interpreter.list_code_contexts()
    assert [c.language for c in listed] == ["python", "javascript", "python"]
    assert listed[-1].id == context.id
    alone = interpreter.run_code("shared", context=context)
    assert alone.error.value == "name 'shared' is not defined"
    assert interpreter.run_code("import os; os.getcwd()", context=context).text == "/tmp"
    interpreter.run_code("y = 5", context=context)
    interpreter.restart_code_context(context)
    assert interpreter.run_code("y", context=context).error.name == "NameError"
    interpreter.remove_code_context(context.id)
    assert context.id not in [c.id for c in interpreter.list_code_contexts()]
    with pytest.raises(NotFoundException):
        interpreter.run_code("1", context=context)
    with pytest.raises(InvalidArgumentException):
        interpreter.run_code("1", language="python", context=listed[0])


def test_javascript_keeps_its_state_imports_awaits_and_streams(interpreter):
    # contract: O11 — a node process per javascript context: state, `import` lines,
    # top-level await, console output, per-cell variables, errors.
    js = {"language": "js"}
    assert interpreter.run_code("let n = 40; n + 2", **js).text == "42"
    assert interpreter.run_code("n * 2", **js).text == "80"
    imported = interpreter.run_code(
        "import { join } from 'path'\nconsole.log(join('a', 'b'))", **js
    )
    assert imported.logs.stdout == ["a/b\n"]
    assert interpreter.run_code("await Promise.resolve('later')", **js).text == "later"
    assert interpreter.run_code("process.cwd()", **js).text == "/home/user"
    assert interpreter.run_code("process.env.ONCE", envs={"ONCE": "o"}, **js).text == "o"
    assert interpreter.run_code("process.env.ONCE || 'gone'", **js).text == "gone"
    failed = interpreter.run_code("missing()", **js)
    assert failed.error.name == "ReferenceError"
    assert failed.error.value == "missing is not defined"


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on this machine for the sandbox to run")
def test_java_keeps_its_state_shows_values_takes_variables_as_properties_and_streams(server):
    # contract: O11 — a JVM per java context (JShell): state, the last expression's value,
    # `println`'s text and line end as two messages (as E2B's Java kernel sends them), the
    # sandbox's and a cell's variables as system properties, errors by exception class.
    sbx = Sandbox.create(timeout=300, envs={"FROM_SANDBOX": "s"})
    try:
        java = {"language": "java"}
        printed = sbx.run_code('System.out.println("Hello, World!")', **java)
        assert printed.logs.stdout == ["Hello, World!", "\n"]
        assert printed.text is None
        assert sbx.run_code("int n = 40;\nn + 2", **java).text == "42"
        assert sbx.run_code("n * 2", **java).text == "80"
        assert sbx.run_code('System.getProperty("user.dir")', **java).text == "/home/user"
        assert sbx.run_code('"a\\tb"', **java).text == "a\tb"
        assert sbx.run_code('System.getProperty("FROM_SANDBOX")', **java).text == "s"
        assert sbx.run_code('System.getProperty("ONCE")', envs={"ONCE": "o"}, **java).text == "o"
        assert sbx.run_code('System.getProperty("ONCE", "gone")', **java).text == "gone"
        failed = sbx.run_code('throw new IllegalStateException("nope")', **java)
        assert failed.error.name == "java.lang.IllegalStateException"
        assert failed.error.value == "nope"
        rejected = sbx.run_code('int wrong = "s";', **java)
        assert rejected.error.name == "CompilationException"
        assert "incompatible types" in rejected.error.value
        # The state outlived the errors.
        assert sbx.run_code("n", **java).text == "40"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_bash_runs_in_a_persistent_shell_and_other_languages_are_refused(interpreter):
    # contract: O11 — bash keeps its directory and variables; a language without a kernel
    # is refused naming the languages there are.
    interpreter.run_code("cd /tmp && export GREETING=hi", language="bash")
    execution = interpreter.run_code("pwd; echo $GREETING", language="bash")
    assert "".join(execution.logs.stdout) == "/tmp\nhi\n"
    failed = interpreter.run_code("false", language="bash")
    assert failed.error.name == "BashError" and failed.error.value == "exit status 1"
    with pytest.raises(Exception, match="no r kernel"):
        interpreter.run_code("1", language="r")


def test_environment_variables_of_the_sandbox_and_of_one_execution(server):
    # contract: O11 — the sandbox's variables are the kernel's; a cell's own apply to it only.
    sbx = Sandbox.create(timeout=300, envs={"FROM_SANDBOX": "s"})
    try:
        read = "import os; (os.environ.get('FROM_SANDBOX'), os.environ.get('ONCE'))"
        assert sbx.run_code(read, envs={"ONCE": "o"}).text == "('s', 'o')"
        assert sbx.run_code(read).text == "('s', None)"
        bash = sbx.run_code("echo $FROM_SANDBOX-$ONCE", language="bash", envs={"ONCE": "b"})
        assert bash.logs.stdout == ["s-b\n"]
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_client_that_gives_up_interrupts_the_cell_and_the_context_goes_on(interpreter):
    # contract: O11 — the SDK's timeout closes the connection; the service interrupts the
    # cell (KeyboardInterrupt), so the next cell runs at once and the state is kept.
    interpreter.run_code("kept = 'yes'")
    with pytest.raises(TimeoutException):
        interpreter.run_code("import time; time.sleep(300)", timeout=2)
    assert interpreter.run_code("kept", timeout=30).text == "yes"


def test_the_kernels_are_not_processes_of_the_sandboxs_list(interpreter):
    # contract: O11 — like E2B's Jupyter, the kernels are not envd's processes.
    interpreter.run_code("1")
    interpreter.run_code("1", language="bash")
    assert interpreter.commands.list() == []


def test_a_kernel_keeps_its_state_across_a_pause_that_keeps_memory(server):
    # contract: O11 — a pause with memory freezes the kernel; after the resume it goes on.
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.run_code("remembered = 7")
        assert sbx.pause()
        resumed = Sandbox.connect(sbx.sandbox_id)
        assert resumed.run_code("remembered * 6").text == "42"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_cell_running_when_its_sandbox_is_killed_raises_that_it_was_killed(server):
    # contract: O11 — the response breaks off with the sandbox; the SDK says it was killed.
    sbx = Sandbox.create(timeout=300)
    started = threading.Event()

    def kill_when_started(message):
        if message.line == "started\n":
            started.set()
            Sandbox.kill(sbx.sandbox_id)

    with pytest.raises(TimeoutException, match="sandbox was killed"):
        sbx.run_code("import time; print('started'); time.sleep(300)", on_stdout=kill_when_started)
    assert started.is_set()


def test_a_private_sandbox_wants_its_traffic_token_on_the_interpreters_port(server):
    # contract: O11, X6 — the SDK sends the token; without it the proxy's 403.
    sbx = Sandbox.create(timeout=300, network={"allow_public_traffic": False})
    try:
        assert sbx.run_code("1 + 1").text == "2"
        assert [c.language for c in sbx.list_code_contexts()] == ["python", "javascript"]
        request = urllib.request.Request(
            f"{server.sandbox_url}/contexts",
            headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"},
        )
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(request, timeout=30)
        assert denied.value.code == 403
        assert "traffic access token" in json.loads(denied.value.read())["message"]
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_kernel_that_dies_is_reported_and_the_context_starts_afresh(interpreter):
    # contract: O11 — a kernel that exits mid-cell ends the cell with ContextRestarting;
    # the next cell gets a new kernel.
    interpreter.run_code("lost = 1")
    died = interpreter.run_code("import os; os._exit(3)")
    assert died.error.name == "ContextRestarting"
    assert interpreter.run_code("lost").error.name == "NameError"
    assert interpreter.run_code("2 * 21").text == "42"


def test_traffic_to_the_interpreter_wakes_an_auto_resume_sandbox_with_its_kernel(server):
    # contract: L19, O11 — a cell sent to a paused autoResume sandbox resumes it; the kernel
    # kept its state.
    sbx = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.run_code("asleep = 'no longer'")
        assert sbx.pause()
        assert sbx.run_code("asleep").text == "no longer"
    finally:
        Sandbox.kill(sbx.sandbox_id)
