//! Which of the two APIs sharing the port a request is for, decided once in
//! `dispatch` and used by request accounting and fault rules.

/// The API a request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plane {
    /// The control plane (E2B's REST API): no `E2b-Sandbox-Id` header.
    Rest,
    /// envd of one sandbox: an `E2b-Sandbox-Id` header or a pre-signed `/files` URL.
    Envd,
}
