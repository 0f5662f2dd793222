//! What every envd handler works with: the shared state and the running sandbox the
//! request was matched to.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::HeaderMap;

use super::connect::{Code, ConnectError};
use crate::app::App;
use crate::isolation::SandboxUser;
use crate::store::RunningSandbox;

/// What an envd handler works with.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub(crate) app: Arc<App>,
    pub(crate) sandbox: RunningSandbox,
}

impl Ctx {
    /// The user named by `Authorization: Basic base64(name:)`, else the default `user`.
    pub(crate) fn user(&self, headers: &HeaderMap) -> Result<SandboxUser, ConnectError> {
        // A request naming no user runs as the built template's, as envd's default.
        let name = basic_username(headers).or_else(|| {
            self.sandbox
                .defaults
                .as_ref()
                .map(|defaults| defaults.user.clone())
        });
        SandboxUser::parse(name.as_deref()).map_err(|m| ConnectError::new(Code::Unauthenticated, m))
    }
}

fn basic_username(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))?;
    let decoded = STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    Some(
        text.split_once(':')
            .map_or(text.as_str(), |(user, _)| user)
            .to_owned(),
    )
}
