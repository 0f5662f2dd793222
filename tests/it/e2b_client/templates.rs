//! Template builds through e2b-client against e2b-local (contract L22): a `TemplateSpec`
//! with COPY (a directory with a symlink), ENV, RUN and WORKDIR steps built with its log
//! callback, a sandbox of the result, a failing step's typed error, tags, and a template
//! converted from a Dockerfile whose writes outside the home stay in its root layer.

use agent_sandbox_examples::e2b_client::template::{BuildOptions, CopyOptions, TemplateSpec};

use super::*;

async fn shell(sandbox: &Sandbox, command: &str) -> String {
    let output = sandbox
        .run(StartOptions::shell(command.to_owned()), 64 * 1024)
        .await
        .expect("ran");
    assert_eq!(output.end.exit_code, 0, "{command}: {:?}", output.stderr);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_built_with_e2b_client_gives_its_sandboxes_the_steps_work() {
    let server = server().await;
    let client = client(&server);
    let context = tempfile::tempdir().expect("context dir");
    let site = context.path().join("site");
    std::fs::create_dir(&site).expect("site dir");
    std::fs::write(site.join("index.html"), "<h1>hello</h1>").expect("index");
    std::os::unix::fs::symlink("index.html", site.join("home.html")).expect("symlink");

    let spec = TemplateSpec::from_base_image()
        .with_file_context(context.path())
        .copy("site", "/home/user/site", &CopyOptions::new())
        .expect("a relative source")
        .set_envs([("GREETING", "hi from $HOME")])
        .run_cmd("echo \"$GREETING\" > /home/user/greeting.txt; echo step-output")
        .set_workdir("/home/user/site");
    let mut logs = Vec::new();
    let info = client
        .build_template(&spec, "it-site:v1", BuildOptions::new(), |entry| {
            logs.push(entry.message)
        })
        .await
        .expect("built");
    assert!(logs.iter().any(|m| m == "step-output"), "{logs:?}");
    assert_eq!(info.tags, vec!["v1".to_owned()]);
    assert!(client.template_exists("it-site:v1").await.expect("exists"));

    let info_sandbox = client
        .create(CreateOptions::new("it-site:v1".to_owned()))
        .await
        .expect("created from the template");
    let sandbox = client
        .sandbox(info_sandbox.envd_access())
        .expect("envd handle");
    assert_eq!(shell(&sandbox, "pwd").await.trim(), "/home/user/site");
    assert_eq!(shell(&sandbox, "cat home.html").await, "<h1>hello</h1>");
    assert_eq!(
        shell(&sandbox, "readlink home.html").await.trim(),
        "index.html"
    );
    assert_eq!(
        shell(&sandbox, "cat /home/user/greeting.txt").await.trim(),
        "hi from /home/user"
    );

    let assigned = client
        .assign_template_tags("it-site:v1", ["stable"])
        .await
        .expect("tagged");
    assert_eq!(assigned.build_id, info.build_id);
    let tags: Vec<String> = client
        .template_tags("it-site")
        .await
        .expect("tags")
        .into_iter()
        .map(|t| t.tag)
        .collect();
    // One build: its tags in name order.
    assert_eq!(tags, ["stable", "v1"]);
    client
        .remove_template_tags("it-site", ["stable"])
        .await
        .expect("untagged");
    let err = client
        .assign_template_tags("missing-template:v1", ["x"])
        .await
        .expect_err("no such template");
    assert!(err.is_not_found(), "{err}");
    server.shutdown().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_step_is_a_typed_error_naming_the_step() {
    let server = server().await;
    let client = client(&server);
    let spec = TemplateSpec::from_base_image()
        .run_cmd("true")
        .run_cmd("echo broken >&2; exit 7");
    let err = client
        .build_template(&spec, "it-broken", BuildOptions::new(), |_| {})
        .await
        .expect_err("the step fails");
    assert!(err.is_build_failed(), "{err}");
    assert_eq!(err.build_step(), Some("2"));
    assert!(err.to_string().contains("exit status 7"), "{err}");
    assert!(!client.template_exists("it-broken").await.expect("exists"));
    server.shutdown().await.expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_from_a_dockerfile_builds_and_its_writes_outside_the_home_stay_in_its_layer() {
    // contract: L22 — a Dockerfile converted by e2b-client builds on e2b-local; what its
    // steps write outside the home and /tmp is the template's (its root layer), not the
    // host's, where the host allows layers.
    let server = server().await;
    let client = client(&server);
    let context = tempfile::tempdir().expect("context dir");
    std::fs::write(context.path().join("app.sh"), "echo from the app\n").expect("app");
    let unique = format!("e2b-client-it-{}", std::process::id());
    let dockerfile = format!(
        "FROM ubuntu:22.04\n\
         ARG GREETING=hello\n\
         WORKDIR /opt/{unique}\n\
         COPY --chmod=755 app.sh ./\n\
         RUN echo \"$GREETING\" > greeting.txt \\\n    && sh app.sh > ran.txt\n\
         USER user\n\
         WORKDIR /home/user\n"
    );
    let spec = TemplateSpec::from_dockerfile(&dockerfile)
        .expect("converted")
        .with_file_context(context.path());
    let outside = std::path::Path::new("/opt").join(&unique);
    let built = client
        .build_template(&spec, "it-dockerfile", BuildOptions::new(), |_| {})
        .await;
    // `/proc/self` belongs to the process's own user.
    let root =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("proc")) == 0;
    if !root {
        // Without namespaces the steps run as the server's user on the host's system,
        // which refuses a directory under /opt: the build fails, naming the step.
        let err = built.expect_err("no /opt for a non-root server");
        assert!(err.is_build_failed(), "{err}");
        return;
    }
    built.expect("built");
    assert!(!outside.exists(), "the build wrote the host's /opt");
    let info = client
        .create(CreateOptions::new("it-dockerfile".to_owned()))
        .await
        .expect("created from the template");
    let sandbox = client.sandbox(info.envd_access()).expect("envd handle");
    assert_eq!(shell(&sandbox, "pwd; whoami").await, "/home/user\nuser\n");
    let dir = outside.display();
    assert_eq!(
        shell(
            &sandbox,
            &format!("cat {dir}/greeting.txt {dir}/ran.txt; stat -c %a {dir}/app.sh")
        )
        .await,
        "hello\nfrom the app\n755\n"
    );
    server.shutdown().await.expect("stops");
}
