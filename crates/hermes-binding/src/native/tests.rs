//! The native module's own checks: the GIL rule of its backend calls, sandbox paths.

use super::sandbox_path;

/// contract: O7. A binding method holds the GIL while it runs; the backend methods that
/// wait for the scope's state lock (whose holder may call back into Python and need the
/// GIL) are only ever reached with the GIL released (`py.detach`, `watched`). The
/// methods called straight on `self.backend` must be the ones that take only leaf locks
/// or none: a new one is a decision to make here, not by accident.
#[test]
fn backend_methods_reached_with_the_gil_held_take_no_state_lock() {
    const LEAF_ONLY: [&str; 7] = [
        "call_deadline",
        "worked_in",
        "set_egress",
        "egress",
        "scope_digest",
        "credentials",
        "set_credentials",
    ];
    let source = include_str!("mod.rs");
    // The module's code, without these tests (whose text names the pattern).
    let code = &source[..source.find("#[cfg(test)]").expect("a test module")];
    let mut rest = code;
    let mut seen = 0;
    while let Some(at) = rest.find("self.backend.") {
        rest = &rest[at + "self.backend.".len()..];
        let method: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(
            LEAF_ONLY.contains(&method.as_str()),
            "`self.backend.{method}` is called with the GIL held; reach it through \
             `py.detach` or `watched`, or add it to LEAF_ONLY if it takes no state lock"
        );
        seen += 1;
    }
    assert!(seen >= LEAF_ONLY.len(), "the scan found the known calls");
}

#[test]
fn relative_sandbox_paths_are_taken_from_the_working_directory() {
    let cwd = Some("/home/user/work/");
    assert_eq!(sandbox_path("/tmp/a".to_owned(), cwd), "/tmp/a");
    assert_eq!(
        sandbox_path("out/a".to_owned(), cwd),
        "/home/user/work/out/a"
    );
    assert_eq!(sandbox_path("out/a".to_owned(), None), "out/a");
    // A cwd Hermes has not resolved yet is no base: the backend refuses the relative path.
    assert_eq!(sandbox_path("out/a".to_owned(), Some("~")), "out/a");
}
