# The kernel of one code-interpreter context: a Python process in the sandbox, driven by
# e2b-local over JSON lines. Requests come on stdin, one per line:
#   {"code": str, "env": {str: str} | null, "silent": bool}
# and every output goes out on the original stdout as the code-interpreter service's wire
# objects (stdout, stderr, result, error, number_of_executions), ended by
# {"type": "end_of_execution"}. The cell's own stdout and stderr (its prints and whatever
# its subprocesses write) are pipes read here, so nothing it writes can be taken for a
# protocol line. argv[1] is the language: "python" (a persistent namespace), "bash" (a
# persistent bash process), "javascript" (a persistent Node process running argv[2]) or
# "java" (a persistent JVM running the JShell host whose source is argv[2]).
import ast
import base64
import codecs
import datetime
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import traceback

LANGUAGE = sys.argv[1] if len(sys.argv) > 1 else "python"

# The protocol channel: the original stdout, kept where no child inherits it.
_proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
_requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
_proto_lock = threading.Lock()
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def emit(obj):
    line = json.dumps(obj, default=str)
    with _proto_lock:
        _proto.write(line + "\n")
        _proto.flush()


class _Stream:
    """One of fds 1 and 2: a pipe read by a thread that sends what arrives as output
    messages, and a marker written at the end of a cell so that everything written
    before it is sent before the cell's end."""

    def __init__(self, fd, kind):
        self.kind = kind
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self.read_end = read_end
        self.fd = fd
        self.seen = threading.Condition()
        self.marks = 0
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = b""
        while True:
            data = os.read(self.read_end, 65536)
            if not data:
                return
            pending += data
            while True:
                at = pending.find(_MARK)
                if at < 0:
                    break
                self._send(decoder.decode(pending[:at]))
                pending = pending[at + len(_MARK):]
                with self.seen:
                    self.marks += 1
                    self.seen.notify_all()
            # Keep a tail that may be the start of a marker.
            keep = 0
            for n in range(min(len(_MARK) - 1, len(pending)), 0, -1):
                if _MARK.startswith(pending[-n:]):
                    keep = n
                    break
            head, pending = pending[: len(pending) - keep], pending[len(pending) - keep:]
            self._send(decoder.decode(head))

    def _send(self, text):
        if text and not _silent[0]:
            emit({"type": self.kind, "text": text, "timestamp": _now()})

    def flush(self):
        with self.seen:
            want = self.marks + 1
            os.write(self.fd, _MARK)
            while self.marks < want:
                self.seen.wait()


_MARK = b"\x00\x1e<e2b-local end of cell>\x1e\x00"
_silent = [False]
_out = _Stream(1, "stdout")
_err = _Stream(2, "stderr")
sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), encoding="utf-8", line_buffering=True)
sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), encoding="utf-8", line_buffering=True)


def _flush_output():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    _out.flush()
    _err.flush()


# ---- rich results ---------------------------------------------------------------------

_REPRS = [
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/pdf", "_repr_pdf_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
]
_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


def _figure_type():
    pyplot = sys.modules.get("matplotlib.figure")
    return getattr(pyplot, "Figure", None)


def _bundle(obj):
    """The MIME bundle of `obj`, as IPython's formatters would give it."""
    bundle = {}
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method) and not isinstance(obj, type):
        try:
            got = method()
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                bundle.update(got)
        except Exception:
            pass
    for mime, name in _REPRS:
        method = getattr(obj, name, None)
        if mime in bundle or not callable(method) or isinstance(obj, type):
            continue
        try:
            value = method()
        except Exception:
            continue
        if isinstance(value, tuple):
            value = value[0]
        if value is not None:
            bundle[mime] = value
    figure = _figure_type()
    if figure is not None and isinstance(obj, figure) and "image/png" not in bundle:
        buffer = io.BytesIO()
        obj.savefig(buffer, format="png", bbox_inches="tight")
        bundle["image/png"] = buffer.getvalue()
        try:
            chart = chart_of(obj)
        except Exception:
            # A figure the extractor does not understand still shows as its picture.
            chart = None
        if chart:
            bundle["e2b/chart"] = chart
    if isinstance(obj, (list, dict)) and "application/json" not in bundle:
        try:
            json.dumps(obj)
            bundle["application/json"] = obj
        except (TypeError, ValueError):
            pass
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(obj, pandas.DataFrame):
        data = obj.to_dict(orient="list")
        bundle["e2b/data"] = {
            str(k): [v.isoformat() if isinstance(v, pandas.Timestamp) else v for v in vs]
            for k, vs in data.items()
        }
    if "text/plain" not in bundle:
        try:
            bundle["text/plain"] = repr(obj)
        except Exception as e:
            bundle["text/plain"] = f"<repr failed: {e!r}>"
    return bundle


def _result(bundle, main):
    out = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in bundle.items():
        if isinstance(value, (bytes, bytearray)):
            value = base64.b64encode(value).decode("ascii")
        field = _FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            out[field] = value
    text = out.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        out["text"] = text[1:-1]
    if extra:
        out["extra"] = extra
    return out


def display(*objs, raw=False, **_ignored):
    """Shows each object as a result that is not the cell's own (IPython's display)."""
    _flush_output()
    for obj in objs:
        if raw and isinstance(obj, dict):
            bundle = dict(obj)
        else:
            bundle = _bundle(obj)
        emit(_result(bundle, False))


def _show_open_figures():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for number in list(pyplot.get_fignums()):
        figure = pyplot.figure(number)
        display(figure)
        pyplot.close(figure)


def _patch_pil(module):
    """As E2B's template: an image a cell saves to a file is shown too, and `Image.show()`
    shows nothing on a sandbox's missing screen."""
    image = getattr(module, "Image", None)
    if image is None or getattr(image.save, "_e2b_shows", False):
        return
    original = image.save

    def save(self, fp, format=None, **options):
        if isinstance(fp, (str, os.PathLike)):
            display(self)
        return original(self, fp, format, **options)

    save._e2b_shows = True
    image.save = save
    try:
        from PIL import ImageShow

        ImageShow.UnixViewer.show_file = lambda self, path, **options: 0
    except Exception:
        pass


class _PilHook:
    """Patches `PIL.Image` when a cell first imports it (not before: importing PIL costs
    every kernel's start, and most cells never use it)."""

    def find_spec(self, name, path=None, target=None):
        if name != "PIL.Image":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            try:
                _patch_pil(module)
            except Exception:
                pass

        loader.exec_module = exec_module
        return spec


def _install_ipython_display():
    """`from IPython.display import display, HTML, ...` shows through this kernel: with
    IPython in the sandbox its display is replaced by ours (there is no IPython shell to
    publish to); without it, a small module of the same names stands in."""
    try:
        import IPython.display

        IPython.display.display = display
        functions = sys.modules.get("IPython.core.display_functions")
        if functions is not None:
            functions.display = display
        return
    except ImportError:
        pass
    import types

    def _kind(name, method, binary=False):
        def __init__(self, data=None, url=None, filename=None, **_ignored):
            if filename is not None:
                with open(filename, "rb" if binary else "r") as f:
                    data = f.read()
            self.data = data
            self.url = url

        def _repr(self):
            return self.data

        return type(name, (), {"__init__": __init__, method: _repr})

    class Image:
        def __init__(self, data=None, url=None, filename=None, format=None, **_ignored):
            if filename is not None:
                with open(filename, "rb") as f:
                    data = f.read()
                format = format or filename.rsplit(".", 1)[-1].lower()
            self.data = data
            self.format = "jpeg" if format in ("jpg", "jpeg") else "png"

        def _repr_png_(self):
            return self.data if self.format == "png" else None

        def _repr_jpeg_(self):
            return self.data if self.format == "jpeg" else None

    module = types.ModuleType("IPython.display")
    module.display = display
    module.Image = Image
    module.HTML = _kind("HTML", "_repr_html_")
    module.Markdown = _kind("Markdown", "_repr_markdown_")
    module.Latex = _kind("Latex", "_repr_latex_")
    module.Math = _kind("Math", "_repr_latex_")
    module.SVG = _kind("SVG", "_repr_svg_")
    module.JSON = _kind("JSON", "_repr_json_")
    module.Javascript = _kind("Javascript", "_repr_javascript_")
    package = types.ModuleType("IPython")
    package.display = module
    # No IPython shell runs here; libraries that look for one when an `IPython` module is
    # loaded (matplotlib does, on import and on choosing a backend) are told so, and are
    # given a version that takes them down today's path, where no shell means no hooks.
    package.get_ipython = lambda: None
    package.version_info = (9, 0, 0, "")
    package.__path__ = []
    sys.modules["IPython"] = package
    sys.modules["IPython.display"] = module


# ---- python cells ---------------------------------------------------------------------

_namespace = {"__name__": "__main__", "__builtins__": __builtins__, "display": display}
_count = [0]


def _translate(code):
    """IPython's line forms this kernel understands: `!command` runs in a shell, `%cd DIR`
    changes directory, `%pwd` shows it, `%env NAME=VALUE` sets a variable."""
    lines = []
    for line in code.split("\n"):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith("!"):
            lines.append(f"{indent}__e2b_shell({stripped[1:]!r})")
        elif stripped.startswith("%cd"):
            target = stripped[3:].strip() or os.path.expanduser("~")
            lines.append(f"{indent}__import__('os').chdir({os.path.expanduser(target)!r})")
        elif stripped.startswith("%pwd"):
            lines.append(f"{indent}__import__('os').getcwd()")
        elif stripped.startswith("%env") and "=" in stripped:
            name, _, value = stripped[4:].strip().partition("=")
            lines.append(f"{indent}__import__('os').environ[{name.strip()!r}] = {value.strip()!r}")
        else:
            lines.append(line)
    return "\n".join(lines)


def _shell(command):
    sys.stdout.flush()
    sys.stderr.flush()
    subprocess.run(command, shell=True, executable="/bin/bash")


_namespace["__e2b_shell"] = _shell


def _error_of(error, skip_frames):
    frames = traceback.extract_tb(error.__traceback__)[skip_frames:]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(error), error)
    return {
        "type": "error",
        "name": type(error).__name__,
        "value": str(error),
        "traceback": "".join(lines),
    }


def _syntax_error(error):
    return {
        "type": "error",
        "name": type(error).__name__,
        "value": f"{error.msg} ({error.filename}, line {error.lineno})",
        "traceback": "".join(traceback.format_exception_only(type(error), error)),
    }


def _run_python(code, filename):
    source = _translate(textwrap_dedent(code))
    flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
    try:
        tree = ast.parse(source, filename, "exec")
    except SyntaxError as error:
        return _syntax_error(error)
    show_last = (
        tree.body
        and isinstance(tree.body[-1], ast.Expr)
        and not source.rstrip().endswith(";")
    )
    body = tree.body[:-1] if show_last else tree.body
    try:
        module = compile(ast.Module(body=body, type_ignores=[]), filename, "exec", flags=flags)
        last = (
            compile(ast.Expression(tree.body[-1].value), filename, "eval", flags=flags)
            if show_last
            else None
        )
    except SyntaxError as error:
        return _syntax_error(error)
    try:
        _evaluate(module)
        value = _evaluate(last) if last is not None else None
    except BaseException as error:  # KeyboardInterrupt included: it is the cell's error
        return _error_of(error, 2)
    _show_open_figures()
    if value is not None:
        _namespace["_"] = value
        _flush_output()
        emit(_result(_bundle(value), True))
    return None


def _evaluate(code):
    import inspect

    result = eval(code, _namespace)
    if inspect.iscoroutine(result) or (code.co_flags & inspect.CO_COROUTINE):
        import asyncio

        return asyncio.run(result) if inspect.iscoroutine(result) else result
    return result


def textwrap_dedent(code):
    import textwrap

    return textwrap.dedent(code)


# ---- bash cells -----------------------------------------------------------------------

_bash = [None]


def _bash_process():
    """The context's bash, started again if it exited; with it the pipe it reports each
    cell's status on."""
    if _bash[0] is None or _bash[0][0].poll() is not None:
        if _bash[0] is not None:
            os.close(_bash[0][1])
        status_r, status_w = os.pipe()
        process = subprocess.Popen(
            ["/bin/bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(status_w,),
            env=dict(os.environ, E2B_STATUS_FD=str(status_w)),
        )
        os.close(status_w)
        _bash[0] = (process, status_r)
    return _bash[0]


def _run_bash(code):
    bash, status_r = _bash_process()
    script = f"{code}\necho $? >&$E2B_STATUS_FD\n"
    status = b""
    try:
        bash.stdin.write(script.encode())
        bash.stdin.flush()
        while not status.endswith(b"\n"):
            chunk = os.read(status_r, 64)
            if not chunk:
                break
            status += chunk
    except KeyboardInterrupt:
        try:
            os.killpg(bash.pid, signal.SIGINT)
        except OSError:
            pass
        return {"type": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""}
    except BrokenPipeError:
        pass
    status = status.strip()
    if not status:
        return {"type": "error", "name": "BashExited", "value": "bash exited", "traceback": ""}
    if status != b"0":
        code = status.decode()
        return {
            "type": "error",
            "name": "BashError",
            "value": f"exit status {code}",
            "traceback": f"the cell's last command exited with status {code}",
        }
    return None


# ---- javascript and java cells ----------------------------------------------------------
# A Node process running the script given as argv[2] (kernel.js), or a JVM running the
# source given there (Kernel.java, through JShell), fed cells on its stdin and answering on
# the pipe named by E2B_ANSWER_FD; its stdout and stderr are this kernel's pipes.

_hosted = [None]


def _hosted_command():
    if LANGUAGE == "java":
        import tempfile

        source = os.path.join(tempfile.mkdtemp(prefix="e2b-java-kernel-"), "Kernel.java")
        with open(source, "w", encoding="utf-8") as f:
            f.write(sys.argv[2])
        return ["java", "-Xshare:auto", "-XX:TieredStopAtLevel=1", source]
    return ["node", "-e", sys.argv[2]]


def _hosted_process():
    if _hosted[0] is None or _hosted[0][0].poll() is not None:
        if _hosted[0] is not None:
            _hosted[0][1].close()
        answer_r, answer_w = os.pipe()
        process = subprocess.Popen(
            _hosted_command(),
            stdin=subprocess.PIPE,
            pass_fds=(answer_w,),
            env=dict(os.environ, E2B_ANSWER_FD=str(answer_w)),
        )
        os.close(answer_w)
        _hosted[0] = (process, os.fdopen(answer_r, "r", encoding="utf-8"))
    return _hosted[0]


def _run_hosted(code, env):
    host, answers = _hosted_process()
    exited = "NodeExited" if LANGUAGE == "javascript" else "JavaExited"
    said = None
    try:
        host.stdin.write((json.dumps({"code": code, "env": env}) + "\n").encode())
        host.stdin.flush()
        while True:
            line = answers.readline()
            said = json.loads(line) if line else None
            # Java's output comes framed on the answer pipe, one message per write.
            if not isinstance(said, dict) or "stream" not in said:
                break
            if not _silent[0] and said["stream"] in ("stdout", "stderr"):
                emit({"type": said["stream"], "text": str(said.get("text", "")), "timestamp": _now()})
    except KeyboardInterrupt:
        host.kill()
        return {"type": "error", "name": "KeyboardInterrupt", "value": "", "traceback": ""}
    except BrokenPipeError:
        said = None
    if not isinstance(said, dict):
        return {"type": "error", "name": exited, "value": f"{_hosted_command_name()} exited", "traceback": ""}
    if "error" in said:
        error = said["error"]
        return {"type": "error", "name": error.get("name", "Error"),
                "value": error.get("value", ""), "traceback": error.get("traceback", "")}
    if "text" in said:
        _flush_output()
        emit(_result({"text/plain": said["text"]}, True))
    return None


def _hosted_command_name():
    return "java" if LANGUAGE == "java" else "node"


# ---- the loop -------------------------------------------------------------------------


def _with_env(env, action):
    if not env:
        return action()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return action()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _cell(request):
    code = request.get("code") or ""
    env = request.get("env") or {}
    silent = bool(request.get("silent"))
    _silent[0] = silent
    if not silent:
        _count[0] += 1
        emit({"type": "number_of_executions", "execution_count": _count[0]})
    if LANGUAGE in ("javascript", "java"):
        error = _run_hosted(code, env)
    elif LANGUAGE == "bash":
        if env:
            exports = "".join(f"export {k}={_quote(v)}\n" for k, v in env.items())
            restore = "".join(
                f"export {k}={_quote(os.environ[k])}\n" if k in os.environ else f"unset {k}\n"
                for k in env
            )
            code = exports + code + "\n__e2b_cell=$?\n" + restore + "(exit $__e2b_cell)"
        error = _run_bash(code)
    else:
        error = _with_env(env, lambda: _run_python(code, f"<cell {_count[0]}>"))
    _flush_output()
    if error is not None and not silent:
        emit(error)
    _silent[0] = False
    emit({"type": "end_of_execution"})


def _quote(value):
    return "'" + value.replace("'", "'\"'\"'") + "'"


def main():
    if LANGUAGE in ("javascript", "java") and not shutil.which(_hosted_command_name()):
        sys.stderr.write(f"no {_hosted_command_name()} in the sandbox's PATH\n")
        sys.exit(3)
    os.environ.setdefault("MPLBACKEND", "Agg")
    _install_ipython_display()
    sys.meta_path.insert(0, _PilHook())
    emit({"type": "ready", "language": LANGUAGE, "pid": os.getpid()})
    while True:
        try:
            line = _requests.readline()
        except KeyboardInterrupt:
            # An interrupt that arrived between cells.
            continue
        if not line:
            return
        try:
            request = json.loads(line)
        except ValueError:
            continue
        try:
            _cell(request)
        except KeyboardInterrupt:
            # Arrived after the cell's own code ended: the cell still ends.
            _silent[0] = False
            emit({"type": "end_of_execution"})


if __name__ == "__main__":
    main()
