//! Sessions and terminals: commands share the server's session as under envd; a PTY
//! process leads a session of its own on a real pseudo-terminal.

use e2b_local::{IsolationMode, Server, ServerConfig};
use serde_json::json;

use crate::support::{Api, new_sandbox};

/// Prints `shared` when the shell neither leads its process group nor its session, then
/// `leads` when `setsid` (the tool) made it lead both under the same pid, as agent-sandbox's
/// launcher expects.
const SESSION_PROBE: &str = "read -r _ _ _ _ group session _ < /proc/$$/stat; \
     [ \"$group\" != $$ ] && [ \"$session\" != $$ ] && echo shared; \
     exec setsid bash -c 'read -r _ _ _ _ group session _ < /proc/$$/stat; \
     [ \"$group\" = $$ ] && [ \"$session\" = $$ ] && echo leads $$'";

#[tokio::test]
async fn commands_start_in_the_servers_session_as_under_envd() {
    // contract: L6 (e2b-local, like envd, gives a command no group of its own, so the
    // launcher's `setsid` runs)
    for mode in [IsolationMode::Auto, IsolationMode::PathMapping] {
        let mut config = ServerConfig::loopback();
        config.isolation = mode;
        let server = Server::start(config).await.unwrap();
        let api = Api::new(&server);
        let sandbox = new_sandbox(&api).await;
        let run = api.run(&sandbox, SESSION_PROBE).await;
        assert_eq!(
            String::from_utf8_lossy(&run.stdout),
            format!("shared\nleads {}\n", run.pid),
            "{mode:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        assert_eq!(run.end, json!({"exited": true, "status": "exit status 0"}));
        server.shutdown().await.unwrap();
    }
}
