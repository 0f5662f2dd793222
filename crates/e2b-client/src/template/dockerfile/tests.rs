//! Unit tests of the Dockerfile reader and its conversion. The expected values come from the
//! official SDK (`e2b` 2.63, `e2b-dockerfile-utils` 0.1.2) run on the same input: the step
//! lists from `Template().from_dockerfile(text)`, the lexer's from its `ShellLex`, the word
//! and flag splitting from `parse_words` and `_extract_builder_flags`.

use std::collections::HashMap;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::shell::{Escapes, Lexer, Quotes, Variables};
use super::syntax::{self, Expansion, Tabs};
use super::{DockerfileError, convert};
use crate::Operation;
use crate::template::TemplateSpec;

/// What the SDK's template holds after `from_dockerfile`: the base, each step's type and
/// arguments, and the start and ready commands.
fn summary(spec: &TemplateSpec) -> Value {
    let body = serde_json::to_value(spec.start_body(&[], false)).expect("serialisable");
    let steps: Vec<Value> = body["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| json!([step["type"], step["args"]]))
        .collect();
    json!({
        "base": body["fromImage"],
        "steps": steps,
        "start": body.get("startCmd").cloned().unwrap_or(Value::Null),
        "ready": body.get("readyCmd").cloned().unwrap_or(Value::Null),
    })
}

/// (name, Dockerfile, the SDK's template as [`summary`] writes it.)
const CONVERTED: &[(&str, &str, &str)] = &[
    (
        "basic",
        "FROM python:3\nRUN pip install numpy\nENV A=1 B=\"x y\"\nCMD [\"python\", \"app.py\"]\n",
        r#"{"base": "python:3", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["pip install numpy"]], ["ENV", ["A", "1", "B", "x y"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": "python app.py", "ready": "sleep 20"}"#,
    ),
    (
        "continuations skip comments and blank lines",
        "FROM alpine\nRUN apk add \\\n    # a comment inside\n    curl \\\n\n    git\n\n# trailing comment\n",
        r#"{"base": "alpine", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["apk add     curl     git"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "escape directive backtick",
        "# escape=`\nFROM mcr.microsoft.com/windows\nRUN dir `\n  c:\\\nWORKDIR c:\\app\nCOPY a` b c:\\dest\\\n",
        r#"{"base": "mcr.microsoft.com/windows", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["dir   c:\\"]], ["WORKDIR", ["c:\\app"]], ["COPY", ["a b", "c:\\dest\\", "", ""]], ["USER", ["user"]]], "start": null, "ready": null}"#,
    ),
    (
        "other directives",
        "# syntax=docker/dockerfile:1\n#check=skip=all\nFROM a\n# escape=`\nRUN echo \\\n x\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo  x"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "env old form",
        "FROM a\nENV PATH /usr/local/bin:$PATH\nENV MSG \"hello world\"  extra\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["PATH", "/usr/local/bin:$PATH"]], ["ENV", ["MSG", "hello world  extra"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "env duplicates keep first place",
        "FROM a\nENV A=1 B=2 A=3\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["A", "3", "B", "2"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "env quoting",
        "FROM a\nENV A=\"a \\\"q\\\" b\" B='single $x' C=a\\ b D=${HOME:-/root} E=$HOME/x F= G=\"\"\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["A", "a \"q\" b", "B", "single $x", "C", "a b", "D", "${HOME:-/root}", "E", "$HOME/x", "F", "", "G", ""]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "arg before and after from",
        "ARG VERSION=3.12\nARG FLAG\nFROM python:${VERSION}\nARG OTHER=\"x y\" PLAIN\nENV V=$VERSION\n",
        r#"{"base": "python:${VERSION}", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["VERSION", "3.12"]], ["ENV", ["FLAG", ""]], ["ENV", ["OTHER", "x y", "PLAIN", ""]], ["ENV", ["V", "$VERSION"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "copy forms",
        "FROM a\nCOPY app.py /app/\nCOPY [\"my file.txt\", \"/data/\"]\nCOPY \"with space.txt\" b.txt /dest/\nCOPY --chown=user:group --chmod=755 run.sh /usr/local/bin/\nADD src/ /src/\nCOPY my\\ file ./rel\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["COPY", ["app.py", "/app/", "", ""]], ["COPY", ["my file.txt", "/data/", "", ""]], ["COPY", ["with space.txt", "/dest/", "", ""]], ["COPY", ["b.txt", "/dest/", "", ""]], ["COPY", ["run.sh", "/usr/local/bin/", "user:group", "0755"]], ["COPY", ["src/", "/src/", "", ""]], ["COPY", ["my file", "./rel", "", ""]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "chmod resolved from arg and env",
        "FROM a\nARG MODE=0644\nENV M2=${MODE}\nCOPY --chmod=$M2 f /x\nCOPY --chmod=${UNSET:-0700} g /y\nCOPY --chmod=\"${M2}\" --chown=${OWNER:-app} h /z\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["MODE", "0644"]], ["ENV", ["M2", "${MODE}"]], ["COPY", ["f", "/x", "", "0644"]], ["COPY", ["g", "/y", "", "0700"]], ["COPY", ["h", "/z", "${OWNER:-app}", "0644"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "chmod through patterns",
        "FROM a\nENV M=0x755 N=ab0644 Q=0644cdc S=0644xy R=x0755x07 T=abx0755 P=07a5a\nCOPY --chmod=${M/x/} f /d\nCOPY --chmod=${M#0x} f /d\nCOPY --chmod=${N#ab} g /d\nCOPY --chmod=${Q%%c*} g /e\nCOPY --chmod=${S%x*} g /e\nCOPY --chmod=${R##*x}55 g /e\nCOPY --chmod=${T#*x} g /e\nCOPY --chmod=${P//a/} h /f\nCOPY --chmod=${M:+0600} i /g\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["M", "0x755", "N", "ab0644", "Q", "0644cdc", "S", "0644xy", "R", "x0755x07", "T", "abx0755", "P", "07a5a"]], ["COPY", ["f", "/d", "", "0755"]], ["COPY", ["f", "/d", "", "0755"]], ["COPY", ["g", "/d", "", "0644"]], ["COPY", ["g", "/e", "", "0644"]], ["COPY", ["g", "/e", "", "0644"]], ["COPY", ["g", "/e", "", "0755"]], ["COPY", ["g", "/e", "", "0755"]], ["COPY", ["h", "/f", "", "0075"]], ["COPY", ["i", "/g", "", "0600"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "copy heredoc to a file",
        "FROM a\nCOPY --chown=app --chmod=600 <<EOF /etc/app.conf\nkey=$VALUE\nline `cmd` \\$x ${A:-b} $(whoami)\nEOF\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["E2B_HEREDOC_DEST=/etc/app.conf\nif [ -d \"$E2B_HEREDOC_DEST\" ]; then E2B_HEREDOC_DEST=\"$E2B_HEREDOC_DEST\"/EOF; fi\nmkdir -p \"$(dirname \"$E2B_HEREDOC_DEST\")\" && cat <<E2B_HEREDOC_EOF >\"$E2B_HEREDOC_DEST\"\nkey=$VALUE\nline \\`cmd\\` \\$x ${A:-b} \\$(whoami)\nE2B_HEREDOC_EOF\nchown app \"$E2B_HEREDOC_DEST\"\nchmod 600 \"$E2B_HEREDOC_DEST\"", "root"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "copy literal heredocs to a directory",
        "FROM a\nCOPY <<'EOF' <<-END /etc/\nliteral $HOME `x`\nEOF\n\tindented\n\t\tdeeper\n\tEND\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["E2B_HEREDOC_DEST=/etc/EOF\nmkdir -p \"$(dirname \"$E2B_HEREDOC_DEST\")\" && cat <<'E2B_HEREDOC_EOF' >\"$E2B_HEREDOC_DEST\"\nliteral $HOME `x`\nE2B_HEREDOC_EOF", "root"]], ["RUN", ["E2B_HEREDOC_DEST=/etc/END\nmkdir -p \"$(dirname \"$E2B_HEREDOC_DEST\")\" && cat <<E2B_HEREDOC_END >\"$E2B_HEREDOC_DEST\"\nindented\ndeeper\nE2B_HEREDOC_END", "root"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "copy heredoc whose body holds the delimiter",
        "FROM a\nCOPY <<EOF /x\nE2B_HEREDOC_EOF\nEOF\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["E2B_HEREDOC_DEST=/x\nif [ -d \"$E2B_HEREDOC_DEST\" ]; then E2B_HEREDOC_DEST=\"$E2B_HEREDOC_DEST\"/EOF; fi\nmkdir -p \"$(dirname \"$E2B_HEREDOC_DEST\")\" && cat <<E2B_HEREDOC_EOF_ >\"$E2B_HEREDOC_DEST\"\nE2B_HEREDOC_EOF\nE2B_HEREDOC_EOF_", "root"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "copy heredoc patterns",
        "FROM a\nCOPY <<EOF /x\n${A#\\*} ${B/\\//_} ${C%%.*} \\\\ \\` trailing\\\nEOF\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["E2B_HEREDOC_DEST=/x\nif [ -d \"$E2B_HEREDOC_DEST\" ]; then E2B_HEREDOC_DEST=\"$E2B_HEREDOC_DEST\"/EOF; fi\nmkdir -p \"$(dirname \"$E2B_HEREDOC_DEST\")\" && cat <<E2B_HEREDOC_EOF >\"$E2B_HEREDOC_DEST\"\n${A#\\*} ${B/\\//_} ${C%%.*} \\\\ \\` trailing\nE2B_HEREDOC_EOF", "root"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "run heredoc script",
        "FROM a\nRUN <<EOF\napt-get update\napt-get install -y curl\nEOF\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["apt-get update\napt-get install -y curl\n"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "run heredoc shebang",
        "FROM a\nRUN <<'PY'\n#!/usr/bin/env python3\nprint('hi')\nPY\nRUN <<-SH\n\t#!/bin/sh\n\techo no newline\n\tSH\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["cat <<'E2B_HEREDOC_PY' >/tmp/PY\n#!/usr/bin/env python3\nprint('hi')\nE2B_HEREDOC_PY\nchmod +x /tmp/PY && /tmp/PY\nE2B_EXIT=$?; rm -f /tmp/PY; exit $E2B_EXIT"]], ["RUN", ["cat <<'E2B_HEREDOC_SH' >/tmp/SH\n#!/bin/sh\necho no newline\nE2B_HEREDOC_SH\nchmod +x /tmp/SH && /tmp/SH\nE2B_EXIT=$?; rm -f /tmp/SH; exit $E2B_EXIT"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "run heredocs in a command",
        "FROM a\nRUN cat <<EOF > /x && python3 <<-PY\nline\nEOF\n\tprint(1)\n\tPY\nRUN 3<<X cat <&3\nfd\nX\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["cat <<EOF > /x && python3 <<-PY\nline\nEOF\n\tprint(1)\nPY"]], ["RUN", ["3<<X cat <&3\nfd\nX"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "run exec form",
        "FROM a\nRUN [\"echo\", \"hello world\", \"it's\", \"$HOME\"]\nRUN [ \"ls\" ]\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo 'hello world' 'it'\"'\"'s' '$HOME'"]], ["RUN", ["ls"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "run flags are dropped",
        "FROM a\nRUN --mount=type=cache,target=/root/.cache --network=none pip install x\nRUN --security=insecure -- --weird\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["pip install x"]], ["RUN", ["--weird"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "metadata and unsupported instructions",
        "FROM a\nEXPOSE 80/tcp\nVOLUME [\"/data\"]\nLABEL a=b c=\"d e\"\nMAINTAINER me\nHEALTHCHECK --interval=5s CMD curl x\nSTOPSIGNAL SIGTERM\nSHELL [\"/bin/bash\", \"-c\"]\nONBUILD RUN x\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "user and workdir kept",
        "FROM a\nUSER app\nWORKDIR /srv\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["app"]], ["WORKDIR", ["/srv"]]], "start": null, "ready": null}"#,
    ),
    (
        "entrypoint exec with cmd exec",
        "FROM a\nENTRYPOINT [\"python\", \"-m\"]\nCMD [\"http.server\", \"8000\"]\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": "python -m http.server 8000", "ready": "sleep 20"}"#,
    ),
    (
        "entrypoint exec with cmd shell",
        "FROM a\nCMD echo $HOME\nENTRYPOINT [\"/entry.sh\"]\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": "/entry.sh /bin/sh -c 'echo $HOME'", "ready": "sleep 20"}"#,
    ),
    (
        "entrypoint shell ignores cmd",
        "FROM a\nENTRYPOINT exec nginx -g \"daemon off;\"\nCMD [\"ignored\"]\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": "exec nginx -g \"daemon off;\"", "ready": "sleep 20"}"#,
    ),
    (
        "cmd shell",
        "FROM a\nCMD    node server.js  \n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": "node server.js", "ready": "sleep 20"}"#,
    ),
    (
        "last cmd wins",
        "FROM a\nCMD [\"first\"]\nCMD [\"second\", \"x y\"]\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": "second 'x y'", "ready": "sleep 20"}"#,
    ),
    (
        "empty cmd is none",
        "FROM a\nCMD []\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "empty entrypoint and cmd",
        "FROM a\nENTRYPOINT []\nCMD\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "from platform and stage name",
        "FROM --platform=linux/amd64 node:20 AS build\nRUN npm ci\n",
        r#"{"base": "node:20", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["npm ci"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "lower-case keywords",
        "from a\nrun echo hi\nWorkDir /x\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo hi"]], ["WORKDIR", ["/x"]], ["USER", ["user"]]], "start": null, "ready": null}"#,
    ),
    (
        "bom and crlf",
        "\u{feff}FROM a\r\nRUN echo hi \\\r\n  there\r\nENV A=1\r\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo hi   there"]], ["ENV", ["A", "1"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "leading blanks",
        "   FROM a\n\t RUN echo x\n  # comment\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo x"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "references kept",
        "FROM a\nWORKDIR $HOME/app\nUSER ${APP_USER:-app}\nENV X=${Y/a/b} Z=${W:+set}\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["WORKDIR", ["$HOME/app"]], ["USER", ["${APP_USER:-app}"]], ["ENV", ["X", "${Y/a/b}", "Z", "${W:+set}"]]], "start": null, "ready": null}"#,
    ),
    (
        "non-ascii",
        "FROM a\nRUN echo héllo ☃ 😀\nENV GREETING=héllo\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo héllo ☃ 😀"]], ["ENV", ["GREETING", "héllo"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "add flags dropped",
        "FROM a\nADD --keep-git-dir=true --checksum=sha256:abc --unpack=false f.tar /x/\nCOPY --link --parents --exclude=*.pyc src /app/\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["COPY", ["f.tar", "/x/", "", ""]], ["COPY", ["src", "/app/", "", ""]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "ends mid-continuation",
        "FROM a\nRUN echo \\",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "escaped escape is no continuation",
        "FROM a\nRUN echo \\\\\nRUN b\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo \\\\"]], ["RUN", ["b"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "continuation with trailing blanks",
        "FROM a\nRUN echo a \\  \t\n  b\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo a   b"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "only escape on a line",
        "FROM a\nRUN echo a \\\n\\\n  b\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo a   b"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "json cmd with escapes",
        "FROM a\nCMD [\"echo\", \"\\u00e9\", \"tab\\there\", \"q\\\"uote\"]\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": "echo 'é' 'tab\there' 'q\"uote'", "ready": "sleep 20"}"#,
    ),
    (
        "json-looking shell form",
        "FROM a\nRUN [not json\nCMD [1 2\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["[not json"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": "[1 2", "ready": "sleep 20"}"#,
    ),
    (
        "flags with quotes",
        "FROM a\nCOPY --chown=\"my user\" '--chmod=0644' f /x\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["COPY", ["--chmod=0644", "/x", "my user", ""]], ["COPY", ["f", "/x", "my user", ""]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "quoted sources",
        "FROM a\nCOPY 'a b' \"c\\\"d\" e\\\"f /x/\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["COPY", ["a b", "/x/", "", ""]], ["COPY", ["c\"d", "/x/", "", ""]], ["COPY", ["e\"f", "/x/", "", ""]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "dollar edge cases",
        "FROM a\nENV A=$ B=cost$ C=$1 D=$@ E=${#} F=$_x G=\\$H\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["A", "$", "B", "cost$", "C", "$1", "D", "$@", "E", "${#}", "F", "$_x", "G", "$H"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "copy heredoc with source and file",
        "FROM a\nCOPY f <<EOF g /dir/\nbody\nEOF\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["COPY", ["f", "/dir/", "", ""]], ["RUN", ["E2B_HEREDOC_DEST=/dir/EOF\nmkdir -p \"$(dirname \"$E2B_HEREDOC_DEST\")\" && cat <<E2B_HEREDOC_EOF >\"$E2B_HEREDOC_DEST\"\nbody\nE2B_HEREDOC_EOF", "root"]], ["COPY", ["g", "/dir/", "", ""]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "run with heredoc and continuation",
        "FROM a\nRUN cat <<EOF \\\n  > /x\nhello\nEOF\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["cat <<EOF   > /x\nhello\nEOF"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "empty heredoc",
        "FROM a\nRUN <<EOF\nEOF\nCOPY <<EOF /x\nEOF\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", [""]], ["RUN", ["E2B_HEREDOC_DEST=/x\nif [ -d \"$E2B_HEREDOC_DEST\" ]; then E2B_HEREDOC_DEST=\"$E2B_HEREDOC_DEST\"/EOF; fi\nmkdir -p \"$(dirname \"$E2B_HEREDOC_DEST\")\" && cat <<E2B_HEREDOC_EOF >\"$E2B_HEREDOC_DEST\"\nE2B_HEREDOC_EOF", "root"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "quoted heredoc marker is literal",
        "FROM a\nRUN echo \"<<EOF\"\nCOPY \"<<EOF\" /x\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["echo \"<<EOF\""]], ["COPY", ["<<EOF", "/x", "", ""]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "heredoc with spaces after marker",
        "FROM a\nRUN cat << EOF\nx\nEOF\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["RUN", ["cat << EOF\nx\nEOF"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "env value with equals",
        "FROM a\nENV URL=http://x/?a=b OPTS=\"--a=1 --b=2\"\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["URL", "http://x/?a=b", "OPTS", "--a=1 --b=2"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "arg default with references",
        "FROM a\nARG A=1\nARG B=${A}2 C=\"${B}3\"\nCOPY --chmod=0${C} f /x\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["A", "1"]], ["ENV", ["B", "${A}2", "C", "${B}3"]], ["COPY", ["f", "/x", "", "0123"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
    (
        "arg without value clears",
        "FROM a\nENV M=0755\nARG M\nCOPY --chmod=${M:-0644} f /x\n",
        r#"{"base": "a", "steps": [["USER", ["root"]], ["WORKDIR", ["/"]], ["ENV", ["M", "0755"]], ["ENV", ["M", ""]], ["COPY", ["f", "/x", "", "0644"]], ["USER", ["user"]], ["WORKDIR", ["/home/user"]]], "start": null, "ready": null}"#,
    ),
];

#[test]
fn dockerfiles_become_the_sdks_steps() {
    for (name, dockerfile, expected) in CONVERTED {
        let spec = TemplateSpec::from_dockerfile(dockerfile)
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        let expected: Value = serde_json::from_str(expected).expect("fixture");
        assert_eq!(summary(&spec), expected, "{name}");
    }
}

/// (name, Dockerfile, the line the SDK blames, when it names one.)
const REFUSED: &[(&str, &str, Option<usize>)] = &[
    ("no from", "RUN x\n", None),
    ("empty file", "", None),
    ("multi-stage", "FROM a AS b\nFROM c\n", None),
    (
        "instruction before from",
        "ARG A=1\nRUN x\nFROM a\n",
        Some(2),
    ),
    ("unknown instruction", "FROM a\nFOO bar\n", Some(2)),
    (
        "copy from stage",
        "FROM a\nCOPY --from=build /x /y\n",
        Some(2),
    ),
    (
        "add remote url",
        "FROM a\nADD https://example.com/x.tar.gz /x/\n",
        Some(2),
    ),
    (
        "absolute copy source",
        "FROM a\nCOPY /etc/passwd /x\n",
        None,
    ),
    (
        "copy source escaping the context",
        "FROM a\nRUN x\nCOPY ../secret /x\n",
        None,
    ),
    ("unknown flag", "FROM a\nRUN --foo=bar x\n", Some(2)),
    (
        "duplicate flag",
        "FROM a\nCOPY --chown=a --chown=b f /x\n",
        Some(2),
    ),
    ("flag without value", "FROM a\nCOPY --chown f /x\n", Some(2)),
    (
        "switch with a bad value",
        "FROM a\nCOPY --link=maybe f /x\n",
        Some(2),
    ),
    (
        "chmod not octal",
        "FROM a\nCOPY --chmod=u+x f /x\n",
        Some(2),
    ),
    (
        "chmod resolving to nothing",
        "FROM a\nCOPY --chmod=$MODE f /x\n",
        Some(2),
    ),
    (
        "chmod required variable",
        "FROM a\nCOPY --chmod=${MODE:?set MODE} f /x\n",
        Some(2),
    ),
    (
        "chmod required variable unset",
        "FROM a\nCOPY --chmod=${MODE:?unset} f /x\n",
        Some(2),
    ),
    (
        "chmod required variable empty",
        "FROM a\nARG MODE\nCOPY --chmod=${MODE:?} f /x\n",
        Some(3),
    ),
    (
        "chmod bad pattern escape",
        "FROM a\nENV M=1\nCOPY --chmod=${M#\\\\a} f /x\n",
        Some(3),
    ),
    ("unterminated heredoc", "FROM a\nRUN <<EOF\necho\n", Some(2)),
    ("unclosed quote", "FROM a\nENV A=\"x\n", Some(2)),
    ("bad substitution", "FROM a\nWORKDIR ${}\n", Some(2)),
    ("unclosed reference", "FROM a\nUSER ${abc\n", Some(2)),
    ("unsupported modifier", "FROM a\nWORKDIR ${a!x}\n", Some(2)),
    ("env without value", "FROM a\nENV A\n", Some(2)),
    ("env mixed forms", "FROM a\nENV A=1 B\n", Some(2)),
    ("env empty name", "FROM a\nENV =x\n", Some(2)),
    ("arg empty name", "FROM a\nARG =x\n", Some(2)),
    ("copy one argument", "FROM a\nCOPY f\n", Some(2)),
    (
        "copy heredoc destination",
        "FROM a\nCOPY f <<EOF\nx\nEOF\n",
        Some(2),
    ),
    (
        "copy heredoc without body",
        "FROM a\nCOPY [\"<<EOF\", \"/x\"]\n",
        Some(2),
    ),
    ("json with a number", "FROM a\nRUN [\"a\", 1]\n", Some(2)),
    ("bad escape directive", "# escape=x\nFROM a\n", Some(1)),
    (
        "repeated directive",
        "# escape=`\n# escape=\\\nFROM a\n",
        Some(2),
    ),
    ("from with two words", "FROM a b\n", Some(1)),
    ("user without argument", "FROM a\nUSER\n", Some(2)),
    ("workdir with a flag", "FROM a\nWORKDIR --x=1 /a\n", Some(2)),
    ("cmd with a flag", "FROM a\nCMD --x echo\n", Some(2)),
    (
        "env required variable",
        "FROM a\nENV Z=${W:?needed}\n",
        Some(2),
    ),
    (
        "non-breaking space splits words",
        "FROM a\nENV GREETING=héllo\u{a0}there\n",
        Some(2),
    ),
    ("empty run", "FROM a\nRUN\n", Some(2)),
    (
        "run flags only",
        "FROM a\nRUN --mount=type=cache\n",
        Some(2),
    ),
    (
        "heredoc body with a bad reference",
        "FROM a\nCOPY <<EOF /x\n${\nEOF\n",
        Some(2),
    ),
    (
        "heredoc body with a bad modifier",
        "FROM a\nCOPY <<EOF /x\n${a:#b}\nEOF\n",
        Some(2),
    ),
    ("label without value", "FROM a\nLABEL x\n", Some(2)),
    (
        "healthcheck json with a number",
        "FROM a\nHEALTHCHECK CMD [\"a\", 2]\n",
        Some(2),
    ),
];

#[test]
fn what_the_sdk_refuses_is_refused_with_its_line() {
    for (name, dockerfile, line) in REFUSED {
        let error = TemplateSpec::from_dockerfile(dockerfile).expect_err(name);
        assert!(error.is_invalid_request(), "{name}: {error:?}");
        assert_eq!(
            error.operation(),
            Some(Operation::ParseDockerfile),
            "{name}"
        );
        if let Some(line) = line {
            assert!(
                error.reason().starts_with(&format!("line {line}: ")),
                "{name}: {error}"
            );
        }
    }
}

#[test]
fn refusals_name_the_problem() {
    let reason = |dockerfile: &str| {
        TemplateSpec::from_dockerfile(dockerfile)
            .expect_err(dockerfile)
            .reason()
    };
    assert_eq!(
        reason("FROM a\nFROM b\n"),
        "more than one FROM: multi-stage Dockerfiles are not supported"
    );
    assert_eq!(reason("RUN x\n"), "there is no FROM instruction");
    assert_eq!(
        reason("FROM a\nRUN x\nCOPY /etc/passwd /x\n"),
        "line 3: Invalid source path \"/etc/passwd\": absolute paths are not allowed; use a path \
         relative to the file context directory"
    );
    assert_eq!(
        reason("FROM a\nCOPY --from=build /x /y\n"),
        "line 2: COPY --from is not supported (multi-stage builds are not)"
    );
    assert_eq!(
        reason("FROM a\n\nFOO bar\n"),
        "line 3: unknown instruction FOO"
    );
    assert_eq!(
        reason("FROM a\nRUN <<EOF\necho\n"),
        "line 2: the heredoc EOF has no closing line"
    );
    assert_eq!(
        reason("FROM a\nCOPY --chmod=$MODE f /x\n"),
        "line 2: --chmod=\"$MODE\" (which is \"\") is not an octal mode like 0755"
    );
    assert_eq!(
        reason("FROM a\nENV A=\"x\n"),
        "line 2: cannot read \"\\\"x\": a double quote is not closed"
    );
    assert_eq!(
        reason("FROM a\nADD https://example.com/x.tgz /x/\n"),
        "line 2: ADD of a remote URL (https://example.com/x.tgz) is not supported; download it \
         in a RUN step"
    );
    let error = TemplateSpec::from_dockerfile("FROM a\nCOPY ../x /y\n").expect_err("escape");
    assert!(
        error
            .to_string()
            .starts_with("E2B parse Dockerfile refused the request: line 2: ")
    );
}

#[test]
fn what_is_left_out_is_a_warning_with_its_line() {
    let converted = convert(
        "FROM --platform=linux/arm64 a\nRUN --mount=type=cache,target=/c x \\\n\n  y\n\
         HEALTHCHECK CMD true\nEXPOSE 80\n",
    )
    .expect("converted");
    assert_eq!(
        converted.warnings,
        [
            "line 4: an empty line continues an instruction (`RUN --mount=type=cache,target=/c \
             x   y`); later Docker versions refuse this",
            "line 1: FROM --platform is not supported by templates and is ignored",
            "line 2: RUN --mount is not supported by templates and is ignored",
            "line 5: HEALTHCHECK has no template equivalent and is ignored",
        ]
    );
    assert_eq!(converted.base_image, "a");
}

#[test]
fn errors_of_the_reader_carry_the_line_or_none() {
    assert_eq!(
        convert("FROM a\nENV A\n").expect_err("no value"),
        DockerfileError {
            line: Some(2),
            reason: "ENV needs a name and a value".to_owned()
        }
    );
    assert_eq!(convert("").expect_err("empty").line, None);
}

fn vars() -> HashMap<String, String> {
    [
        ("A", "aaa"),
        ("E", ""),
        ("P", "/usr/local/bin"),
        ("S", "a b  c"),
        ("X", "x.tar.gz"),
        ("R", "baac"),
        ("N", "foo-bar-foo"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// (word, what it reads as; `None`: refused.)
const RESOLVED: &[(&str, Option<&str>)] = &[
    ("plain", Some("plain")),
    ("'single $A'", Some("single $A")),
    ("\"double $A \\\" \\$A \\x\"", Some("double aaa \" $A \\x")),
    ("$A$A", Some("aaaaaa")),
    ("${A}b", Some("aaab")),
    ("${U}", Some("")),
    ("$U", Some("")),
    ("${U:-def}", Some("def")),
    ("${E:-def}", Some("def")),
    ("${E-def}", Some("")),
    ("${A:+alt}", Some("alt")),
    ("${U:+alt}", Some("")),
    ("${A+alt}", Some("alt")),
    ("${E+alt}", Some("alt")),
    ("${X%.*}", Some("x.tar")),
    ("${X%%.*}", Some("x")),
    ("${X#*.}", Some("tar.gz")),
    ("${X##*.}", Some("gz")),
    ("${P/usr/opt}", Some("/opt/local/bin")),
    ("${P//\\//:}", Some(":usr:local:bin")),
    ("${R//a*/-}", Some("b-")),
    ("${R/a/-}", Some("b-ac")),
    ("${N//foo/X}", Some("X-bar-X")),
    ("${N/#foo/X}", Some("foo-bar-foo")),
    ("${R//x*/-}", Some("baac")),
    ("${R//?/_}", Some("____")),
    ("${R//*/-}", Some("--")),
    ("${E//*/-}", Some("-")),
    ("${R/*/-}", Some("-")),
    ("${U//*/-}", Some("-")),
    ("${R//a\\*/-}", Some("baac")),
    ("${A:-${U:-deep}}", Some("aaa")),
    ("a\\ b", Some("a b")),
    ("\\$A", Some("$A")),
    ("tail\\", Some("tail")),
    ("${X%\\.gz}", None),
    ("${X#x?}", Some("tar.gz")),
    ("$1$@$#", Some("")),
    ("${S}", Some("a b  c")),
    ("pre${S}post", Some("prea b  cpost")),
    ("<<EOF", Some("<<EOF")),
    ("a < b", Some("a < b")),
    ("'unterminated", None),
    ("${A", None),
    ("${A:?}", Some("aaa")),
    ("${U?no}", None),
    ("${E:?empty}", None),
    ("${A!}", None),
    ("${A:#x}", None),
    ("${}", None),
    ("${:x}", None),
    ("${A/x", None),
    ("$", Some("$")),
    ("${A%\\q}", None),
    ("€${A}ü", Some("€aaaü")),
];

const KEPT: &[(&str, Option<&str>)] = &[
    ("plain", Some("plain")),
    ("'single $A'", Some("single $A")),
    ("\"double $A \\\" \\$A \\x\"", Some("double $A \" $A \\x")),
    ("$A$A", Some("$A$A")),
    ("${A}b", Some("${A}b")),
    ("${U}", Some("${U}")),
    ("$U", Some("$U")),
    ("${U:-def}", Some("${U:-def}")),
    ("${E:-def}", Some("${E:-def}")),
    ("${E-def}", Some("${E-def}")),
    ("${A:+alt}", Some("${A:+alt}")),
    ("${U:+alt}", Some("${U:+alt}")),
    ("${A+alt}", Some("${A+alt}")),
    ("${E+alt}", Some("${E+alt}")),
    ("${X%.*}", Some("${X%.*}")),
    ("${X%%.*}", Some("${X%%.*}")),
    ("${X#*.}", Some("${X#*.}")),
    ("${X##*.}", Some("${X##*.}")),
    ("${P/usr/opt}", Some("${P/usr/opt}")),
    ("${P//\\//:}", Some("${P//\\//:}")),
    ("${R//a*/-}", Some("${R//a*/-}")),
    ("${R/a/-}", Some("${R/a/-}")),
    ("${N//foo/X}", Some("${N//foo/X}")),
    ("${N/#foo/X}", Some("${N/#foo/X}")),
    ("${R//x*/-}", Some("${R//x*/-}")),
    ("${R//?/_}", Some("${R//?/_}")),
    ("${R//*/-}", Some("${R//*/-}")),
    ("${E//*/-}", Some("${E//*/-}")),
    ("${R/*/-}", Some("${R/*/-}")),
    ("${U//*/-}", Some("${U//*/-}")),
    ("${R//a\\*/-}", Some("${R//a\\*/-}")),
    ("${A:-${U:-deep}}", Some("${A:-${U:-deep}}")),
    ("a\\ b", Some("a b")),
    ("\\$A", Some("$A")),
    ("tail\\", Some("tail")),
    ("${X%\\.gz}", Some("${X%\\.gz}")),
    ("${X#x?}", Some("${X#x?}")),
    ("$1$@$#", Some("$1$@$#")),
    ("${S}", Some("${S}")),
    ("pre${S}post", Some("pre${S}post")),
    ("<<EOF", Some("<<EOF")),
    ("a < b", Some("a < b")),
    ("'unterminated", None),
    ("${A", None),
    ("${A:?}", Some("${A:?}")),
    ("${U?no}", Some("${U?no}")),
    ("${E:?empty}", Some("${E:?empty}")),
    ("${A!}", None),
    ("${A:#x}", None),
    ("${}", None),
    ("${:x}", None),
    ("${A/x", None),
    ("$", Some("$")),
    ("${A%\\q}", Some("${A%\\q}")),
    ("€${A}ü", Some("€${A}ü")),
];

#[test]
fn words_read_as_the_sdks_lexer_reads_them() {
    let vars = vars();
    let resolving = Lexer {
        variables: Variables::Resolve(&vars),
        ..Lexer::keeping_variables('\\')
    };
    for (word, expected) in RESOLVED {
        assert_eq!(
            resolving.word(word).ok().as_deref(),
            *expected,
            "resolving {word:?}"
        );
    }
    let keeping = Lexer::keeping_variables('\\');
    for (word, expected) in KEPT {
        assert_eq!(
            keeping.word(word).ok().as_deref(),
            *expected,
            "keeping {word:?}"
        );
    }
    let words = [
        ("a b  c", vec!["a", "b", "c"]),
        ("$S x", vec!["a", "b", "c", "x"]),
        ("'$S' \"$S\"", vec!["$S", "a b  c"]),
        ("'' x", vec!["", "x"]),
        ("a\\ b c", vec!["a b", "c"]),
        ("<< EOF x", vec!["<< EOF", "x"]),
        ("x ${S}y", vec!["x", "a", "b", "cy"]),
    ];
    for (text, expected) in words {
        assert_eq!(resolving.words(text).expect(text), expected, "{text:?}");
    }
}

#[test]
fn the_escape_directive_changes_the_lexers_escape() {
    let lexer = Lexer::keeping_variables('`');
    assert_eq!(lexer.word(r"c:\dir` x").expect("read"), r"c:\dir x");
    assert_eq!(lexer.word("\"a`\"b\"").expect("read"), "a\"b");
    let raw = Lexer {
        quotes: Quotes::Keep,
        escapes: Escapes::Keep,
        ..Lexer::keeping_variables('\\')
    };
    assert_eq!(
        raw.word(r#"'a' "b\"" \c"#).expect("read"),
        r#"'a' "b\"" \c"#
    );
}

#[test]
fn arguments_split_into_words_with_quotes_kept() {
    let cases = [
        ("a b", vec!["a", "b"]),
        ("\"a b\" c", vec!["\"a b\"", "c"]),
        ("'a \\' b' c", vec!["'a \\'", "b' c"]),
        ("a\\ b", vec!["a\\ b"]),
        ("x\"y z\"w", vec!["x\"y z\"w"]),
        ("tail\\", vec!["tail"]),
        ("\"open", vec!["\"open"]),
        ("\"esc\\\" q\" r", vec!["\"esc\\\" q\"", "r"]),
        ("'' x", vec!["''", "x"]),
        ("a  \t b", vec!["a", "b"]),
    ];
    for (text, expected) in cases {
        assert_eq!(syntax::words(text, '\\'), expected, "{text:?}");
    }
}

#[test]
fn builder_flags_end_at_the_first_other_word() {
    let cases: [(&str, &str, Vec<&str>); 10] = [
        ("--a=1 --b rest of it", "rest of it", vec!["--a=1", "--b"]),
        ("--a=\"x y\" z", "z", vec!["--a=x y"]),
        ("'--q' z", "'--q' z", vec![]),
        ("-- --x", " --x", vec![]),
        ("--x --", "", vec!["--x"]),
        ("--x", "", vec!["--x"]),
        ("--e=a\\ b c", "c", vec!["--e=a b"]),
        ("-x", "-x", vec![]),
        ("--a=\"unterminated", "", vec!["--a=unterminated"]),
        ("  --z=1   tail  ", "tail  ", vec!["--z=1"]),
    ];
    for (text, rest, flags) in cases {
        assert_eq!(
            syntax::builder_flags(text, '\\'),
            (
                rest.to_owned(),
                flags.iter().map(|f| f.to_string()).collect::<Vec<_>>()
            ),
            "{text:?}"
        );
    }
}

/// A heredoc marker's name, tab handling and expansion.
type Marker<'a> = (&'a str, Tabs, Expansion);

#[test]
fn heredoc_markers_are_recognised_as_the_sdk_does() {
    let cases: [(&str, Option<Marker<'_>>); 13] = [
        ("<<EOF", Some(("EOF", Tabs::Keep, Expansion::Expand))),
        ("<<-EOF", Some(("EOF", Tabs::Strip, Expansion::Expand))),
        ("2<<EOF", Some(("EOF", Tabs::Keep, Expansion::Expand))),
        ("<<'EOF'", Some(("EOF", Tabs::Keep, Expansion::Literal))),
        ("<<\"E\"OF", Some(("EOF", Tabs::Keep, Expansion::Literal))),
        ("<< EOF", Some(("EOF", Tabs::Keep, Expansion::Expand))),
        ("<<", None),
        ("<<a<b", None),
        ("x<<EOF", None),
        ("<<EOF x", None),
        ("<<$V", Some(("$V", Tabs::Keep, Expansion::Expand))),
        ("<<\\EOF", Some(("EOF", Tabs::Keep, Expansion::Expand))),
        ("<<E\\OF", Some(("EOF", Tabs::Keep, Expansion::Expand))),
    ];
    for (word, expected) in cases {
        let found = syntax::heredoc_marker(word)
            .expect(word)
            .map(|heredoc| (heredoc.name, heredoc.tabs, heredoc.expansion));
        assert_eq!(
            found,
            expected.map(|(name, tabs, expansion)| (name.to_owned(), tabs, expansion)),
            "{word:?}"
        );
    }
}

#[test]
fn the_path_variant_reads_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("Dockerfile");
    std::fs::write(&path, "FROM python:3\nRUN echo hi\n").expect("write");
    let spec = TemplateSpec::from_dockerfile_path(&path).expect("read");
    assert_eq!(summary(&spec)["base"], "python:3");
    let error =
        TemplateSpec::from_dockerfile_path(dir.path().join("missing")).expect_err("missing");
    assert!(error.is_invalid_request(), "{error:?}");
    assert!(error.reason().contains("missing"), "{error}");
    std::fs::write(&path, b"FROM a\nRUN \xff\n").expect("write");
    let error = TemplateSpec::from_dockerfile_path(&path).expect_err("not UTF-8");
    assert!(error.is_invalid_request(), "{error:?}");
}

/// Dockerfile-shaped text: keywords, quotes, escapes, references, heredoc markers.
const DOCKERFILE_TEXT: &str = "(FROM a\n)?([A-Za-z$\\\\\"'`<{}:#%/?*=\\- \t\n\r-]|RUN |COPY |ENV |<<EOF\n|EOF\n|\\$\\{){0,80}";

/// One word with every character the lexer treats specially.
const WORD_TEXT: &str = "[a-z$\\\\\"'`{}:#%/?*+\\- ]{0,40}";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever the text, the reader answers; it never panics or loops.
    #[test]
    fn any_text_is_converted_or_refused(text in DOCKERFILE_TEXT) {
        let _ = convert(&text);
    }

    /// Whatever the word, each lexer answers.
    #[test]
    fn any_word_is_read_or_refused(word in WORD_TEXT) {
        let vars = vars();
        let resolving = Lexer {
            variables: Variables::Resolve(&vars),
            ..Lexer::keeping_variables('\\')
        };
        let _ = resolving.word(&word);
        let _ = Lexer::keeping_variables('`').words(&word);
    }
}
