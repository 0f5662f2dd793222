//! The code interpreter through e2b-client: cells with state, streamed output, rich
//! results, contexts and languages, an interrupted cell, a killed sandbox, a private
//! sandbox's traffic token, and a port's host (contract: O11).

use agent_sandbox_examples::e2b_client::{
    CodeLanguage, CodeOutput, CreateOptions, EgressRules, NetworkConfig, RemoveContextOutcome,
    RunCodeOptions,
};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_keeps_state_streams_its_output_and_shows_rich_results() {
    // contract: O11 — state, stdout/stderr as pieces, the main result, display(), errors.
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let python = RunCodeOptions::default_context;

    let first = sandbox.run_code("x = 41", python()).await.expect("ran");
    assert_eq!((first.text(), first.error.as_ref()), (None, None));
    let second = sandbox
        .run_code(
            "import sys\nprint('out'); print('err', file=sys.stderr)\nx + 1",
            python(),
        )
        .await
        .expect("ran");
    assert_eq!(second.text(), Some("42"));
    assert_eq!(second.stdout, ["out\n"]);
    assert_eq!(second.stderr, ["err\n"]);
    assert_eq!(second.execution_count, first.execution_count.map(|n| n + 1));

    let shown = sandbox
        .run_code(
            "from IPython.display import display, HTML\n\
             display(HTML('<b>b</b>'))\n\
             display({'text/latex': '$y$', 'application/x-mine': 'm'}, raw=True)\n\
             [1, 'two']",
            python(),
        )
        .await
        .expect("ran");
    let [html, latex, main] = shown.results.as_slice() else {
        panic!("three results: {shown:?}");
    };
    assert_eq!(html.html.as_deref(), Some("<b>b</b>"));
    assert!(!html.is_main_result);
    assert_eq!(latex.formats(), ["latex", "application/x-mine"]);
    assert!(main.is_main_result);
    assert_eq!(main.json, Some(serde_json::json!([1, "two"])));

    let failed = sandbox.run_code("nope", python()).await.expect("ran");
    let error = failed.error.expect("an error");
    assert_eq!(error.name, "NameError");
    assert_eq!(error.value, "name 'nope' is not defined");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_arrives_while_the_cell_still_runs() {
    // contract: O11 — the cell waits for a file that only the reader of its first line writes.
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let mut run = sandbox
        .stream_code(
            "import os, time\nprint('waiting', flush=True)\n\
             deadline = time.monotonic() + 60\n\
             while not os.path.exists('/home/user/go'):\n\
             \x20   assert time.monotonic() < deadline\n\
             \x20   time.sleep(0.02)\n\
             print('done')",
            RunCodeOptions::default_context(),
        )
        .await
        .expect("started");
    let mut seen = Vec::new();
    while let Some(output) = run.next().await.expect("output") {
        if let CodeOutput::Stdout(message) = output {
            if message.text == "waiting\n" {
                sandbox
                    .write_file("/home/user/go", Bytes::from_static(b"go"))
                    .await
                    .expect("written");
            }
            assert!(message.timestamp.is_some());
            seen.push(message.text);
        }
    }
    assert_eq!(seen, ["waiting\n", "done\n"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_languages_and_per_cell_variables() {
    // contract: O11 — create (cwd), list, restart, remove; bash and javascript; a cell's own
    // variables.
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let context = sandbox
        .create_code_context(CodeLanguage::Python, Some("/tmp"))
        .await
        .expect("created");
    assert_eq!(
        (context.language.as_str(), context.cwd.as_str()),
        ("python", "/tmp")
    );
    let listed = sandbox.list_code_contexts().await.expect("listed");
    let languages: Vec<&str> = listed.iter().map(|c| c.language.as_str()).collect();
    assert_eq!(languages, ["python", "javascript", "python"]);
    assert_eq!(listed.last(), Some(&context));
    let here = RunCodeOptions::context(context.id.clone());
    let cwd = sandbox
        .run_code("import os; os.getcwd()", here.clone())
        .await
        .expect("ran");
    assert_eq!(cwd.text(), Some("/tmp"));
    sandbox
        .run_code("kept = 1", here.clone())
        .await
        .expect("ran");
    sandbox
        .restart_code_context(&context.id)
        .await
        .expect("restarted");
    let gone = sandbox.run_code("kept", here.clone()).await.expect("ran");
    assert_eq!(gone.error.map(|e| e.name).as_deref(), Some("NameError"));
    assert_eq!(
        sandbox
            .remove_code_context(&context.id)
            .await
            .expect("removed"),
        RemoveContextOutcome::Removed
    );
    assert_eq!(
        sandbox
            .remove_code_context(&context.id)
            .await
            .expect("answered"),
        RemoveContextOutcome::NotFound
    );
    let error = sandbox
        .run_code("1", here)
        .await
        .expect_err("no such context");
    assert!(error.is_not_found(), "{error}");
    assert!(error.to_string().contains("run code"), "{error}");

    let mut bash = RunCodeOptions::language(CodeLanguage::Bash);
    bash.envs.insert("ONCE".to_owned(), "o".to_owned());
    let out = sandbox
        .run_code("cd /tmp; echo \"$ONCE $(pwd)\"", bash)
        .await
        .expect("ran");
    assert_eq!(out.stdout.concat(), "o /tmp\n");
    let again = sandbox
        .run_code(
            "echo \"[$ONCE] $(pwd)\"",
            RunCodeOptions::language(CodeLanguage::Bash),
        )
        .await
        .expect("ran");
    assert_eq!(again.stdout.concat(), "[] /tmp\n");
    let refused = sandbox
        .run_code("1", RunCodeOptions::language(CodeLanguage::R))
        .await
        .expect_err("no r kernel");
    assert!(refused.to_string().contains("no r kernel"), "{refused}");

    let js = sandbox
        .run_code(
            "const greeting = 'hi'; console.log(greeting); [1, 2].length",
            RunCodeOptions::language(CodeLanguage::JavaScript),
        )
        .await
        .expect("ran");
    assert_eq!(
        (js.stdout.concat().as_str(), js.text()),
        ("hi\n", Some("2"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_past_its_timeout_is_interrupted_and_the_context_goes_on() {
    // contract: O11 — the client's timeout drops the connection; the service interrupts.
    let server = server().await;
    let client = client(&server);
    let (_, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    sandbox
        .run_code("kept = 'yes'", RunCodeOptions::default_context())
        .await
        .expect("ran");
    let mut slow = RunCodeOptions::default_context();
    slow.timeout = Some(Duration::from_secs(1));
    let error = sandbox
        .run_code("import time; time.sleep(300)", slow)
        .await
        .expect_err("past its timeout");
    assert!(error.is_deadline_exceeded(), "{error}");
    let after = sandbox
        .run_code("kept", RunCodeOptions::default_context())
        .await
        .expect("ran");
    assert_eq!(after.text(), Some("yes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_whose_sandbox_is_killed_fails_as_sandbox_gone() {
    // contract: O11 — the stream breaks off; the probe finds the sandbox gone.
    let server = server().await;
    let client = client(&server);
    let (info, sandbox) = create(&client, OnTimeout::Kill, 600).await;
    let mut run = sandbox
        .stream_code(
            "import time; print('started', flush=True); time.sleep(300)",
            RunCodeOptions::default_context(),
        )
        .await
        .expect("started");
    let first = run.next().await.expect("output");
    assert!(
        matches!(first, Some(CodeOutput::ExecutionCount(_))),
        "{first:?}"
    );
    let started = run.next().await.expect("output");
    assert!(
        matches!(started, Some(CodeOutput::Stdout(_))),
        "{started:?}"
    );
    assert_eq!(
        client.kill(&info.sandbox_id).await.expect("killed"),
        KillOutcome::Killed
    );
    let error = loop {
        match run.next().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the cell ended although its sandbox was killed"),
            Err(error) => break error,
        }
    };
    assert!(error.is_sandbox_gone(), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_sandbox_is_reached_with_its_traffic_token_and_a_port_has_a_host() {
    // contract: O11, X6 — the handle carries the token from create's answer.
    let server = server().await;
    let client = client(&server);
    let mut options = CreateOptions::new("code-interpreter-v1".to_owned());
    options.timeout = Some(Duration::from_secs(600));
    let mut network = NetworkConfig::new(EgressRules::unrestricted());
    network.allow_public_traffic = Some(false);
    options.network = Some(network);
    let info = client.create(options).await.expect("created");
    assert!(info.traffic_access_token.is_some());
    let sandbox = client.sandbox(info.envd_access()).expect("handle");
    let ran = sandbox
        .run_code("6 * 7", RunCodeOptions::default_context())
        .await
        .expect("ran");
    assert_eq!(ran.text(), Some("42"));
    let mut without = info.envd_access();
    without.traffic_access_token = None;
    let refused = client
        .sandbox(without)
        .expect("handle")
        .list_code_contexts()
        .await
        .expect_err("no token");
    assert!(
        refused.to_string().contains("traffic access token"),
        "{refused}"
    );
    assert_eq!(
        sandbox.host(3000),
        format!("3000-{}.e2b.app", info.sandbox_id)
    );
}
