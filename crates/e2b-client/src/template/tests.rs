//! Unit tests of the template spec (steps, quoting, ready commands), the files hash and the
//! archive.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::answers::strip_ansi;
use super::dockerfile::shell_quote;
use super::files::{collect, pack};
use super::*;

mod render;

fn plan(src: &str, dest: &str, symlinks: SymlinkMode) -> CopyPlan {
    CopyPlan {
        src: src.to_owned(),
        dest: dest.to_owned(),
        symlinks,
        upload: UploadMode::WhenMissing,
        ignore: Vec::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn body_of(spec: &TemplateSpec, hashes: &[Option<String>], force: bool) -> serde_json::Value {
    serde_json::to_value(spec.start_body(hashes, force)).expect("serialisable")
}

/// `folder/` (0755) with `test.txt` (0644, "hello\n") and `symlink.txt -> test.txt`, and
/// `app.py` (0644): the fixture of the wire notes (the wire tests' build context too).
pub(crate) fn fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let folder = dir.path().join("folder");
    fs::create_dir(&folder).expect("mkdir");
    fs::write(folder.join("test.txt"), "hello\n").expect("write");
    symlink("test.txt", folder.join("symlink.txt")).expect("symlink");
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::set_permissions(folder.join("test.txt"), fs::Permissions::from_mode(0o644)).expect("chmod");
    fs::write(dir.path().join("app.py"), "print('hi')\n").expect("write");
    fs::set_permissions(dir.path().join("app.py"), fs::Permissions::from_mode(0o644))
        .expect("chmod");
    dir
}

#[test]
fn shell_quoting_matches_shlex() {
    let cases = [
        ("", "''"),
        ("abc", "abc"),
        ("/usr/bin/python3", "/usr/bin/python3"),
        ("a-b_c@d%e+f=g:h,i.j", "a-b_c@d%e+f=g:h,i.j"),
        ("a b", "'a b'"),
        ("it's", r#"'it'"'"'s'"#),
        ("$HOME", "'$HOME'"),
        ("x;rm -rf /", "'x;rm -rf /'"),
        ("café", "'café'"),
        ("*.txt", "'*.txt'"),
    ];
    for (raw, quoted) in cases {
        assert_eq!(shell_quote(raw), quoted, "{raw:?}");
    }
}

#[test]
fn ready_commands_are_the_sdks_strings() {
    assert_eq!(
        ReadyCmd::wait_for_port(8000).as_str(),
        r#"[ -n "$(ss -Htuln sport = :8000)" ]"#
    );
    assert_eq!(
        ReadyCmd::wait_for_url("http://localhost:3000/health", 200).as_str(),
        r#"curl -s -o /dev/null -w "%{http_code}" http://localhost:3000/health | grep -q "200""#
    );
    assert_eq!(
        ReadyCmd::wait_for_url("http://x/?a=1&b=2", 204).as_str(),
        r#"curl -s -o /dev/null -w "%{http_code}" 'http://x/?a=1&b=2' | grep -q "204""#
    );
    assert_eq!(
        ReadyCmd::wait_for_process("my server").as_str(),
        "pgrep 'my server' > /dev/null"
    );
    assert_eq!(
        ReadyCmd::wait_for_process("nginx").as_str(),
        "pgrep nginx > /dev/null"
    );
    assert_eq!(
        ReadyCmd::wait_for_file("/tmp/ready x").as_str(),
        "[ -f '/tmp/ready x' ]"
    );
    assert_eq!(
        ReadyCmd::wait_for_timeout(Duration::from_millis(500)).as_str(),
        "sleep 1"
    );
    assert_eq!(
        ReadyCmd::wait_for_timeout(Duration::from_millis(10_000)).as_str(),
        "sleep 10"
    );
    assert_eq!(
        ReadyCmd::wait_for_timeout(Duration::from_millis(2_999)).as_str(),
        "sleep 2"
    );
}

#[test]
fn helpers_emit_the_sdks_steps() {
    let mut remove = RemoveOptions::new();
    remove.recursion = Recursion::Recursive;
    remove.force = Force::On;
    let mut rename = RenameOptions::new();
    rename.force = Force::On;
    rename.user = Some("root".to_owned());
    let mut mkdir = MakeDirOptions::new();
    mkdir.mode = Some(0o700);
    let mut link = SymlinkOptions::new();
    link.force = Force::On;
    let mut apt = AptOptions::new();
    apt.recommends = Recommends::Skip;
    apt.fix_missing = Force::On;
    let mut clone = GitCloneOptions::new();
    clone.branch = Some("main".to_owned());
    clone.depth = Some(1);
    clone.path = Some("/src/y".to_owned());
    let mut closed = MakeDirOptions::new();
    closed.mode = Some(0);
    let spec = TemplateSpec::from_base_image()
        .run_cmd("whoami")
        .run_cmd_as("whoami", "root")
        .remove(["/tmp/a b", "/tmp/c"], remove)
        .rename("/tmp/x", "/tmp/y", rename)
        .make_dir(["/data", "/logs"], mkdir)
        .make_dir(["/plain"], MakeDirOptions::new())
        .make_dir(["/closed"], closed)
        .make_symlink("/usr/bin/python3", "/usr/bin/python", link)
        .pip_install(["numpy", "pandas"], PipScope::Global)
        .pip_install(["requests"], PipScope::User)
        .pip_install(Vec::<String>::new(), PipScope::Global)
        .apt_install(["git", "curl"], apt)
        .apt_install(["vim"], AptOptions::new())
        .git_clone("https://example.com/x/y.git", clone)
        .set_envs([("A", "1"), ("B", "two words")])
        .set_envs(Vec::<(String, String)>::new())
        .set_workdir("/app")
        .set_user("user");
    let body = body_of(&spec, &[], false);
    let steps: Vec<(String, Vec<String>)> = body["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| {
            assert_eq!(step["force"], false, "{step}");
            assert!(step.get("filesHash").is_none(), "{step}");
            (
                step["type"].as_str().expect("type").to_owned(),
                serde_json::from_value(step["args"].clone()).expect("args"),
            )
        })
        .collect();
    let expected: Vec<(&str, Vec<&str>)> = vec![
        ("RUN", vec!["whoami"]),
        ("RUN", vec!["whoami", "root"]),
        ("RUN", vec!["rm -r -f '/tmp/a b' /tmp/c"]),
        ("RUN", vec!["mv /tmp/x /tmp/y -f", "root"]),
        ("RUN", vec!["mkdir -p -m 0700 /data /logs"]),
        ("RUN", vec!["mkdir -p /plain"]),
        // Mode 0 is written too, as the SDK writes it.
        ("RUN", vec!["mkdir -p -m 0000 /closed"]),
        ("RUN", vec!["ln -s -f /usr/bin/python3 /usr/bin/python"]),
        ("RUN", vec!["pip install numpy pandas", "root"]),
        ("RUN", vec!["pip install --user requests"]),
        ("RUN", vec!["pip install .", "root"]),
        (
            "RUN",
            vec![
                "apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes \
                 apt-get install -y --no-install-recommends --fix-missing git curl",
                "root",
            ],
        ),
        (
            "RUN",
            vec![
                "apt-get update && DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes \
                 apt-get install -y vim",
                "root",
            ],
        ),
        (
            "RUN",
            vec![
                "git clone https://example.com/x/y.git --branch main --single-branch --depth 1 \
                 /src/y",
            ],
        ),
        ("ENV", vec!["A", "1", "B", "two words"]),
        ("WORKDIR", vec!["/app"]),
        ("USER", vec!["user"]),
    ];
    let expected: Vec<(String, Vec<String>)> = expected
        .into_iter()
        .map(|(kind, args)| {
            (
                kind.to_owned(),
                args.into_iter().map(String::from).collect(),
            )
        })
        .collect();
    assert_eq!(steps, expected);
    assert_eq!(body["fromImage"], "e2bdev/base");
    assert!(body.get("fromTemplate").is_none());
    assert!(body.get("startCmd").is_none() && body.get("readyCmd").is_none());
}

#[test]
fn the_start_body_is_the_captured_one() {
    let mut mode = CopyOptions::new();
    mode.mode = Some(0o755);
    let spec = TemplateSpec::from_base_image()
        .copy("folder", "/home/user/folder", &CopyOptions::new())
        .expect("valid")
        .copy("app.py", "/app/", &mode)
        .expect("valid")
        .run_cmd_as("whoami", "root")
        .set_start_cmd("python -m http.server 8000", ReadyCmd::wait_for_port(8000));
    let hashes = vec![Some("d849".to_owned()), Some("a381".to_owned()), None];
    let body = serde_json::to_string(&spec.start_body(&hashes, false)).expect("json");
    assert_eq!(
        body,
        r#"{"fromImage":"e2bdev/base","force":false,"steps":[{"type":"COPY","args":["folder","/home/user/folder","",""],"filesHash":"d849","force":false},{"type":"COPY","args":["app.py","/app/","","0755"],"filesHash":"a381","force":false},{"type":"RUN","args":["whoami","root"],"force":false}],"startCmd":"python -m http.server 8000","readyCmd":"[ -n \"$(ss -Htuln sport = :8000)\" ]"}"#
    );
}

#[test]
fn skip_cache_forces_every_later_step_and_force_upload_its_own() {
    let mut always = CopyOptions::new();
    always.upload = UploadMode::Always;
    always.user = Some("me:staff".to_owned());
    always.mode = Some(0);
    let spec = TemplateSpec::from_template("team/base:v2")
        .copy("a", "/a", &always)
        .expect("valid")
        .run_cmd("one")
        .skip_cache()
        .set_workdir("/w")
        .copy("b", "/b", &CopyOptions::new())
        .expect("valid")
        .set_ready_cmd("true");
    let body = body_of(&spec, &[], true);
    let forces: Vec<bool> = body["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| step["force"].as_bool().expect("bool"))
        .collect();
    assert_eq!(forces, [true, false, true, true]);
    assert_eq!(body["steps"][0]["forceUpload"], true);
    assert_eq!(
        body["steps"][0]["args"],
        serde_json::json!(["a", "/a", "me:staff", "0000"])
    );
    assert!(body["steps"][3].get("forceUpload").is_none());
    assert_eq!(body["fromTemplate"], "team/base:v2");
    assert!(body.get("fromImage").is_none());
    assert_eq!(body["force"], true);
    assert_eq!(body["readyCmd"], "true");
    assert!(body.get("startCmd").is_none());
}

#[test]
fn copy_sources_must_stay_in_the_context() {
    let spec = || TemplateSpec::from_base_image();
    let options = CopyOptions::new();
    for bad in ["/etc/passwd", "../x", "a/../../x", "./../x", ""] {
        let error = spec().copy(bad, "/x", &options).expect_err(bad);
        assert!(error.is_invalid_request(), "{error:?}");
    }
    let error = spec().copy("/etc", "/x", &options).expect_err("absolute");
    assert!(
        error.reason().contains("absolute paths are not allowed"),
        "{error}"
    );
    let error = spec().copy("../x", "/x", &options).expect_err("escape");
    assert!(error.reason().contains("escapes the context"), "{error}");
    for good in ["a", "./a", "a/../b", "dir/**/*.py", ".env"] {
        assert!(spec().copy(good, "/x", &options).is_ok(), "{good}");
    }
}

/// The hash of the wire notes' fixture, built from its definition by hand.
#[test]
fn the_files_hash_follows_the_algorithm_byte_for_byte() {
    let dir = fixture();
    let ctx = dir.path();
    let mut expected = Vec::new();
    expected.extend_from_slice(b"COPY folder /home/user/folder");
    // The directory: its mode (0o40755), no size in 2.63.
    expected.extend_from_slice(b"folder16877");
    // The link, not followed: lstat mode (0o120777), size (its target's length), target.
    expected.extend_from_slice(b"folder/symlink.txt414718test.txt");
    // The file: mode (0o100644), size, content.
    expected.extend_from_slice(b"folder/test.txt331886hello\n");
    let hash = copy_hash(
        ctx,
        &plan("folder", "/home/user/folder", SymlinkMode::Preserve),
    )
    .expect("hashed");
    assert_eq!(hash, hex(&Sha256::digest(&expected)));

    // Followed, the link hashes as the file it points at.
    let mut resolved = Vec::new();
    resolved.extend_from_slice(b"COPY folder /home/user/folder");
    resolved.extend_from_slice(b"folder16877");
    resolved.extend_from_slice(b"folder/symlink.txt331886hello\n");
    resolved.extend_from_slice(b"folder/test.txt331886hello\n");
    let hash = copy_hash(
        ctx,
        &plan("folder", "/home/user/folder", SymlinkMode::Resolve),
    )
    .expect("hashed");
    assert_eq!(hash, hex(&Sha256::digest(&resolved)));

    // A single file, with a context given as a relative path.
    let mut single = Vec::new();
    single.extend_from_slice(b"COPY app.py /app/app.py3318812print('hi')\n");
    let cwd = std::env::current_dir().expect("cwd");
    let relative_ctx = pathdiff(ctx, &cwd);
    let hash = copy_hash(
        &relative_ctx,
        &plan("app.py", "/app/", SymlinkMode::Preserve),
    )
    .expect("hashed");
    assert_eq!(hash, hex(&Sha256::digest(&single)));

    // The content counts.
    fs::write(ctx.join("app.py"), "print('ho')\n").expect("write");
    let changed = copy_hash(ctx, &plan("app.py", "/app/", SymlinkMode::Preserve)).expect("hashed");
    assert_ne!(changed, hash);
}

/// `path` relative to `base` through `..` (both absolute).
fn pathdiff(path: &Path, base: &Path) -> std::path::PathBuf {
    let ups = base.components().count() - 1;
    let mut out = std::path::PathBuf::new();
    for _ in 0..ups {
        out.push("..");
    }
    out.push(path.strip_prefix("/").expect("absolute"));
    out
}

#[test]
fn sources_are_globbed_and_sorted_by_their_text() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ctx = dir.path();
    fs::create_dir_all(ctx.join("x/y")).expect("mkdir");
    fs::write(ctx.join("x/y/z"), "z").expect("write");
    fs::write(ctx.join("x-a"), "a").expect("write");
    fs::write(ctx.join(".env"), "e").expect("write");
    fs::create_dir(ctx.join("other")).expect("mkdir");
    symlink(ctx.join("other"), ctx.join("x/linked")).expect("symlink");
    fs::write(ctx.join("other/inside"), "i").expect("write");
    let names = |src: &str| -> Vec<String> {
        collect(ctx, src, &[])
            .expect("found")
            .iter()
            .map(|path| {
                path.strip_prefix(ctx)
                    .expect("inside")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    };
    // By text: "x" < "x-a" < "x/…" ('-' sorts before '/'); a linked directory is not
    // descended into.
    assert_eq!(names("x*"), ["x", "x-a", "x/linked", "x/y", "x/y/z"]);
    // `dir/*` is the directory's entries, not the directory; a match that leads to a
    // directory (through a link too, as the SDK's `isdir`) brings what is below it.
    assert_eq!(
        names("x/*"),
        ["x/linked", "x/linked/inside", "x/y", "x/y/z"]
    );
    assert_eq!(names("**/z"), ["x/y/z"]);
    // Dot files match `*`.
    assert!(names("*").contains(&".env".to_owned()));
    let error = collect(ctx, "missing*", &[]).expect_err("nothing");
    assert!(error.starts_with("No files found in "), "{error}");
}

#[test]
fn dockerignore_and_the_specs_patterns_leave_files_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ctx = dir.path();
    for file in [
        "app/main.py",
        "app/main.pyc",
        "app/keep.pyc",
        "app/node_modules/x/index.js",
        "app/logs/a.log",
        "app/logs/keep/b.log",
    ] {
        fs::create_dir_all(ctx.join(file).parent().expect("parent")).expect("mkdir");
        fs::write(ctx.join(file), file).expect("write");
    }
    fs::write(
        ctx.join(".dockerignore"),
        "# build output\n**/*.pyc\n\n!app/keep.pyc\napp/node_modules\n",
    )
    .expect("write");
    let names = |ignore: &[String]| -> Vec<String> {
        collect(ctx, "app", ignore)
            .expect("found")
            .iter()
            .map(|path| {
                path.strip_prefix(ctx)
                    .expect("inside")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    };
    assert_eq!(
        names(&[]),
        [
            "app",
            "app/keep.pyc",
            "app/logs",
            "app/logs/a.log",
            "app/logs/keep",
            "app/logs/keep/b.log",
            "app/main.py"
        ]
    );
    // The spec's patterns come last, so they win; a directory takes what is below it.
    let spec = [
        "/app/logs/".to_owned(),
        "!app/logs/keep".to_owned(),
        "app/keep.pyc".to_owned(),
    ];
    assert_eq!(
        names(&spec),
        ["app", "app/logs/keep", "app/logs/keep/b.log", "app/main.py"]
    );
    // The hash sees what the archive carries.
    let mut ignored = plan("app", "/app", SymlinkMode::Preserve);
    ignored.ignore = spec.to_vec();
    let all = copy_hash(ctx, &plan("app", "/app", SymlinkMode::Preserve)).expect("hashed");
    assert_ne!(copy_hash(ctx, &ignored).expect("hashed"), all);
    let tar = pack(ctx, &ignored, Vec::new()).expect("packed");
    let mut archive = tar::Archive::new(tar.as_slice());
    let members: Vec<String> = archive
        .entries()
        .expect("entries")
        .map(|entry| {
            entry
                .expect("entry")
                .path()
                .expect("path")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        members,
        ["app", "app/logs/keep", "app/logs/keep/b.log", "app/main.py"]
    );
}

#[test]
fn the_archive_holds_the_files_links_and_modes() {
    let dir = fixture();
    let ctx = dir.path();
    let read_back = |symlinks: SymlinkMode| {
        let tar = pack(ctx, &plan("folder", "/f", symlinks), Vec::new()).expect("packed");
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut members = Vec::new();
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            let name = entry.path().expect("path").to_string_lossy().into_owned();
            let kind = entry.header().entry_type();
            let mode = entry.header().mode().expect("mode");
            let link = entry
                .link_name()
                .expect("link")
                .map(|link| link.to_string_lossy().into_owned());
            let mut content = String::new();
            entry.read_to_string(&mut content).expect("content");
            members.push((name, kind, mode, link, content));
        }
        members
    };
    use tar::EntryType::{Directory, Regular, Symlink};
    assert_eq!(
        read_back(SymlinkMode::Preserve),
        [
            ("folder".to_owned(), Directory, 0o755, None, String::new()),
            (
                "folder/symlink.txt".to_owned(),
                Symlink,
                0o777,
                Some("test.txt".to_owned()),
                String::new()
            ),
            (
                "folder/test.txt".to_owned(),
                Regular,
                0o644,
                None,
                "hello\n".to_owned()
            ),
        ]
    );
    let resolved = read_back(SymlinkMode::Resolve);
    assert_eq!(
        resolved[1],
        (
            "folder/symlink.txt".to_owned(),
            Regular,
            0o644,
            None,
            "hello\n".to_owned()
        )
    );

    // A broken link cannot be resolved.
    symlink("nowhere", ctx.join("folder/broken")).expect("symlink");
    let error =
        pack(ctx, &plan("folder", "/f", SymlinkMode::Resolve), Vec::new()).expect_err("broken");
    assert!(error.contains("cannot resolve"), "{error}");
}

#[test]
fn the_upload_is_gzipped_and_long_names_survive() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ctx = dir.path();
    let deep = format!("{}/{}", "d".repeat(120), "f".repeat(120));
    fs::create_dir_all(ctx.join("d".repeat(120))).expect("mkdir");
    fs::write(ctx.join(&deep), "deep").expect("write");
    let target = "t".repeat(150);
    symlink(&target, ctx.join("long-link")).expect("symlink");
    let archive = write_archive(ctx, &plan("*", "/x", SymlinkMode::Preserve)).expect("archive");
    let mut bytes = Vec::new();
    let mut file = archive.file;
    file.read_to_end(&mut bytes).expect("read");
    assert_eq!(bytes.len() as u64, archive.len);
    assert_eq!(&bytes[..2], [0x1f, 0x8b], "gzip magic");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
    let mut seen = Vec::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let name = entry.path().expect("path").to_string_lossy().into_owned();
        let link = entry
            .link_name()
            .expect("link")
            .map(|link| link.to_string_lossy().into_owned());
        let mut content = String::new();
        entry.read_to_string(&mut content).expect("content");
        seen.push((name, link, content));
    }
    assert_eq!(
        seen,
        [
            ("d".repeat(120), None, String::new()),
            (deep.clone(), None, "deep".to_owned()),
            ("long-link".to_owned(), Some(target), String::new()),
        ]
    );
}

#[test]
fn ansi_codes_are_stripped_from_log_messages() {
    assert_eq!(strip_ansi("\u{1b}[31mred\u{1b}[0m plain"), "red plain");
    assert_eq!(strip_ansi("\u{1b}]8;;http://x\u{7}link"), "link");
    assert_eq!(strip_ansi("no codes [1/2]"), "no codes [1/2]");
}

#[test]
fn node_installs_and_image_shorthands_are_the_sdks() {
    let spec = TemplateSpec::from_node_image("24")
        .npm_install(
            ["typescript", "tsx"],
            NodeScope::Global,
            DependencyKind::Regular,
        )
        .npm_install(["vitest"], NodeScope::Project, DependencyKind::Development)
        .npm_install(
            Vec::<String>::new(),
            NodeScope::Project,
            DependencyKind::Regular,
        )
        .bun_install(["zod"], NodeScope::Global, DependencyKind::Development)
        .bun_install(
            Vec::<String>::new(),
            NodeScope::Project,
            DependencyKind::Regular,
        );
    let body = body_of(&spec, &[], false);
    assert_eq!(body["fromImage"], "node:24");
    let steps: Vec<Vec<String>> = body["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|step| {
            assert_eq!(step["type"], "RUN");
            serde_json::from_value(step["args"].clone()).expect("args")
        })
        .collect();
    let run = |command: &str, user: Option<&str>| -> Vec<String> {
        std::iter::once(command.to_owned())
            .chain(user.map(str::to_owned))
            .collect()
    };
    assert_eq!(
        steps,
        vec![
            run("npm install -g typescript tsx", Some("root")),
            run("npm install --save-dev vitest", None),
            run("npm install", None),
            run("bun install -g --dev zod", Some("root")),
            run("bun install", None),
        ]
    );
    for (spec, image) in [
        (
            TemplateSpec::from_debian_image("bookworm"),
            "debian:bookworm",
        ),
        (TemplateSpec::from_ubuntu_image("24.04"), "ubuntu:24.04"),
        (TemplateSpec::from_fedora_image("44"), "fedora:44"),
        (TemplateSpec::from_alpine_image("3.24"), "alpine:3.24"),
        (TemplateSpec::from_arch_image("latest"), "archlinux:latest"),
        (TemplateSpec::from_python_image("3"), "python:3"),
        (TemplateSpec::from_bun_image("latest"), "oven/bun:latest"),
    ] {
        let body = body_of(&spec, &[], false);
        assert_eq!(body["fromImage"], image);
        assert!(body.get("fromImageRegistry").is_none());
    }
}

#[test]
fn registry_credentials_go_in_the_body_as_the_sdk_sends_them_and_nowhere_else() {
    let secret = |value: &str| crate::SecretValue::new(value.to_owned());
    let cases = [
        (
            RegistryCredentials::Basic {
                username: "me".to_owned(),
                password: secret("pw-4f1c2a9b"),
            },
            serde_json::json!({"type": "registry", "username": "me", "password": "pw-4f1c2a9b"}),
        ),
        (
            RegistryCredentials::Aws {
                access_key_id: "AKIAEXAMPLE".to_owned(),
                secret_access_key: secret("aws-secret-77aa"),
                region: "us-east-1".to_owned(),
            },
            serde_json::json!({"type": "aws", "awsAccessKeyId": "AKIAEXAMPLE",
                "awsSecretAccessKey": "aws-secret-77aa", "awsRegion": "us-east-1"}),
        ),
        (
            RegistryCredentials::Gcp {
                service_account_json: secret(r#"{"private_key":"gcp-key-1234"}"#),
            },
            serde_json::json!({"type": "gcp", "serviceAccountJson": r#"{"private_key":"gcp-key-1234"}"#}),
        ),
    ];
    for (credentials, wire) in cases {
        let spec = TemplateSpec::from_private_image("registry.example/app:1", credentials);
        let body = body_of(&spec, &[], false);
        assert_eq!(body["fromImage"], "registry.example/app:1");
        assert_eq!(body["fromImageRegistry"], wire);
        let debug = format!("{spec:?}");
        let exposed = spec.registry_secrets();
        assert_eq!(exposed.len(), 1);
        assert!(
            !debug.contains(exposed[0].expose()),
            "the secret shows in Debug: {debug}"
        );
    }
}
