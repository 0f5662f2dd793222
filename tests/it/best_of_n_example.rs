//! Runs `examples/best_of_n.rs` against an e2b-local this test owns, then checks the outcome
//! from the outside: the passing attempt's files are the scope's, a later session of the
//! scope attaches to that branch, and every other sandbox of the run is gone.

#[allow(dead_code)]
#[path = "../../examples/best_of_n.rs"]
mod example;

use agent_sandbox_examples::e2b_client::{ApiKey, Client, Config, SandboxId};
use agent_sandbox_examples::e2b_local::Server;

#[test]
fn best_of_n_adopts_the_branch_whose_tests_pass_and_kills_the_rest() {
    // contract: R6 — the adopted branch becomes the scope's sandbox; the branches not
    // adopted and the sandbox it replaced are killed.
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let server = runtime
        .block_on(Server::start_loopback())
        .expect("e2b-local starts");
    let home = tempfile::tempdir().expect("a scope directory");
    let mut out = Vec::new();
    let outcome =
        example::run(&runtime, &server.url(), home.path(), &mut out).expect("the example runs");
    let text = String::from_utf8(out).expect("utf-8 output");

    // Only "add" (attempt 1) fixes calc.sh; the others fail their tests.
    assert_eq!(outcome.adopted, Some(1), "{text}");
    assert_eq!(outcome.branches.len(), 3, "{text}");
    assert_eq!(outcome.sandbox, outcome.branches[1], "{text}");
    for expected in [
        format!("sandbox {}: tests exit 1: FAIL", outcome.parent),
        format!(
            "branch 0 (multiply) in {}: tests exit 1: FAIL",
            outcome.branches[0]
        ),
        format!(
            "branch 1 (add) in {}: tests exit 0: PASS",
            outcome.branches[1]
        ),
        format!(
            "branch 2 (count the arguments) in {}: tests exit 1: FAIL",
            outcome.branches[2]
        ),
        format!(
            "adopted branch 1 (add): sandbox {} is the scope's now",
            outcome.branches[1]
        ),
        format!("sandbox {}: tests exit 0: PASS", outcome.branches[1]),
    ] {
        assert!(text.contains(&expected), "missing {expected:?} in:\n{text}");
    }

    // A later session of the scope attaches to the adopted branch and finds its fix.
    let later = example::backend(&runtime, &server.url(), home.path()).expect("a backend");
    let (code, output) = example::sh(
        &later,
        "cd /home/user/project && grep -c 'total + n' calc.sh && bash test.sh",
    )
    .expect("the tests run");
    assert_eq!((code, output.as_str()), (0, "1\nPASS\n"), "{text}");
    assert_eq!(
        later.info().expect("attached").sandbox_id,
        outcome.branches[1]
    );
    later.cleanup();

    // Everything else of the run is gone.
    let mut config = Config::new(ApiKey::new("best-of-n-test".to_owned()));
    config.api_url = Some(server.url());
    config.sandbox_url = Some(server.url());
    let client = Client::new(config).expect("a client");
    for gone in [&outcome.parent, &outcome.branches[0], &outcome.branches[2]] {
        let id = SandboxId::parse(gone.clone()).expect("a sandbox id");
        let answer = runtime.block_on(client.get(&id));
        assert!(
            answer.as_ref().is_err_and(|error| error.is_not_found()),
            "{gone} should be gone: {answer:?}\n{text}"
        );
    }
    let id = SandboxId::parse(outcome.branches[1].clone()).expect("a sandbox id");
    runtime
        .block_on(client.get(&id))
        .expect("the adopted branch lives");
    runtime
        .block_on(server.shutdown())
        .expect("e2b-local stops");
}
