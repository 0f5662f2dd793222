"""Files to the user: Hermes' gateway delivers a ``MEDIA:`` file the agent made in the sandbox
through the environment's ``fetch_realpath`` and ``fetch_file`` (Hermes' #466 seam,
``gateway.media_fetch``). Every test goes through the gateway's own entry points
(``BasePlatformAdapter.extract_media`` and ``filter_media_delivery_paths``, what the gateway
runs on a response) with the plugin's native fetch underneath (contract X8). The gateway only
extracts tags whose extension it delivers, hence `.pdf` and `.zip`."""

from __future__ import annotations

import json
import textwrap

from conftest import assert_no_key
from test_environment import PRELUDE, configured  # noqa: F401 - fixture re-used

#: Driver helpers: the gateway's delivery of one response text, and SHA-256 on both sides.
HELPERS = """
import hashlib, os, pathlib
from gateway.platforms.base import BasePlatformAdapter
import gateway.media_fetch as media_fetch
def deliver(text):
    media, _ = BasePlatformAdapter.extract_media(text)
    return [path for path, _ in BasePlatformAdapter.filter_media_delivery_paths(media)]
def host_sha(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
def remote_sha(path):
    return T(f"sha256sum {path} | cut -d' ' -f1")["output"].strip()
def cache_files():
    root = pathlib.Path(os.environ["HERMES_HOME"]) / "cache" / "documents"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
"""


def run(home, body, **kwargs):
    out = home.driver(PRELUDE + HELPERS + textwrap.dedent(body), **kwargs)
    assert_no_key(out["log"], json.dumps(out["result"]))
    return out["result"], out["log"]


def test_a_media_file_made_in_the_sandbox_reaches_the_user_byte_exact(configured):  # noqa: F811
    # contract: X8
    home, _ = configured
    result, log = run(home, """
        r = {}
        r["made"] = T("mkdir -p /home/user/out /home/user/.ssh && head -c 3000017 /dev/urandom > /home/user/out/report.pdf"
                      " && ln -s report.pdf /home/user/out/link.pdf && echo SECRET > /home/user/.ssh/id_rsa"
                      " && ln -s ../.ssh/id_rsa /home/user/out/innocent.txt && mkdir /home/user/out/dir.pdf")
        env = tt._active_environments["default"]
        r["native"] = all(name in type(env).__dict__ for name in ("fetch_file", "fetch_realpath"))
        r["want"] = remote_sha("/home/user/out/report.pdf")
        # Through a link: Hermes screens and names the resolved path.
        r["delivered"] = deliver("Here is the report. MEDIA:/home/user/out/link.pdf")
        r["got"] = [host_sha(p) for p in r["delivered"]]
        r["cache_after_one"] = cache_files()
        # A link to a credential: refused by Hermes on the resolved path, nothing fetched.
        r["secret"] = deliver("MEDIA:/home/user/out/innocent.txt")
        # Missing, and a directory: nothing delivered, nothing left.
        r["missing"] = deliver("MEDIA:/home/user/out/none.pdf")
        r["dir"] = deliver("MEDIA:/home/user/out/dir.pdf")
        r["realpath_missing_dir"] = env.fetch_realpath("/home/user/nowhere/x")
        # Relative to the environment's cwd, as Hermes' own command-based fetch would take it.
        r["cwd"] = env.cwd
        r["realpath_relative"] = env.fetch_realpath("out/link.pdf")
        # Over Hermes' cap: refused while downloading, nothing left in the document cache.
        media_fetch._FETCH_MAX_BYTES = 3000016
        r["over_cap"] = deliver("MEDIA:/home/user/out/report.pdf")
        media_fetch._FETCH_MAX_BYTES = 3000017
        r["at_cap"] = deliver("MEDIA:/home/user/out/report.pdf")
        r["cache_after_all"] = cache_files()
        try:
            env.fetch_file("/home/user/out/report.pdf", pathlib.Path(os.environ["HERMES_HOME"]) / "x", max_bytes=10)
            r["error"] = None
        except Exception as error:
            from tools.environments.base import FileFetchError
            r["error"] = {"hermes": isinstance(error, FileFetchError), "text": str(error),
                          "sandbox": env.sandbox_id}
        finish(r)
    """, timeout=300)
    assert result["made"]["exit_code"] == 0, result["made"]
    assert result["native"] is True
    assert len(result["delivered"]) == 1, log[-3000:]
    assert "/cache/documents/remote_" in result["delivered"][0]
    assert result["delivered"][0].endswith("_report.pdf"), "named after the resolved path"
    assert result["got"] == [result["want"]]
    assert result["secret"] == [] and result["missing"] == [] and result["dir"] == []
    assert result["realpath_missing_dir"] is None
    assert result["cwd"] == "/home/user"
    assert result["realpath_relative"] == "/home/user/out/report.pdf"
    assert result["over_cap"] == []
    assert len(result["at_cap"]) == 1
    # Only the two delivered copies: no failure left a file or a temp file behind.
    assert len(result["cache_after_one"]) == 1
    assert len(result["cache_after_all"]) == 2, result["cache_after_all"]
    error = result["error"]
    assert error["hermes"] is True, error
    assert "fetch file" in error["text"] and error["sandbox"] in error["text"], error
    assert "larger than the cap of 10 bytes" in error["text"], error
    # Hermes logged the refusals as skipped deliveries, without a traceback.
    assert "Remote media fetch of /home/user/out/report.pdf skipped" in log, log[-3000:]
    assert "Traceback" not in log


def test_a_50_mb_media_file_keeps_host_memory_flat(configured):  # noqa: F811
    # contract: X8 — Hermes' cap is 50 MiB; a file of exactly that size arrives through the
    # gateway's path byte-exact while the driver's peak resident set (VmHWM, reset before)
    # grows by less than 8 MiB. Hermes' own default (base64 through a command's output, the
    # same environment's BaseEnvironment.fetch_file) is measured beside it for the figures.
    home, _ = configured
    result, log = run(home, """
        import time
        from tools.environments.base import BaseEnvironment
        sizes = {"40": 40 << 20, "50": 50 << 20}
        r = {"want": {}, "native": {}, "base64": {}}
        for name, size in sizes.items():
            T(f"mkdir -p /home/user/out && head -c {size} /dev/urandom > /home/user/out/big{name}.zip")
            r["want"][name] = remote_sha(f"/home/user/out/big{name}.zip")
        env = tt._active_environments["default"]
        T("head -c 1048576 /dev/urandom > /home/user/out/warm.zip")
        deliver("MEDIA:/home/user/out/warm.zip")  # warm every path once, with a small file
        for name in sizes:
            reset_peak()
            before = peak()
            started = time.monotonic()
            delivered = deliver(f"MEDIA:/home/user/out/big{name}.zip")
            seconds = time.monotonic() - started
            r["native"][name] = {"seconds": seconds, "grown": peak() - before,
                                 "sha": [host_sha(p) for p in delivered]}
        for name in sizes:
            dest = pathlib.Path(os.environ["HERMES_HOME"]) / f"base64-{name}.bin"
            reset_peak()
            before = peak()
            started = time.monotonic()
            BaseEnvironment.fetch_file(env, f"/home/user/out/big{name}.zip", dest, max_bytes=50 << 20)
            seconds = time.monotonic() - started
            r["base64"][name] = {"seconds": seconds, "grown": peak() - before, "sha": [host_sha(dest)]}
        finish(r)
    """, timeout=900)
    for name, label in (("40", "40 MiB"), ("50", "50 MiB")):
        native, base64 = result["native"][name], result["base64"][name]
        print(f"{label} MEDIA fetch: Hermes' base64 default {base64['seconds']:.2f} s, "
              f"+{base64['grown'] / (1 << 20):.0f} MiB peak RSS; native "
              f"{native['seconds']:.2f} s, +{native['grown'] / (1 << 20):.1f} MiB peak RSS")
        assert native["sha"] == [result["want"][name]], name
        assert base64["sha"] == [result["want"][name]], name
    assert result["native"]["50"]["grown"] < 8 << 20, result["native"]["50"]
