//! E2B's MCP gateway: a sandbox created from the `mcp-gateway` template with `mcp` servers
//! (see [`CreateOptions::mcp`](crate::CreateOptions::mcp)) serves them as one MCP endpoint
//! on port [`MCP_PORT`], which wants the token the gateway writes into the sandbox.

use super::Sandbox;
use crate::error::Error;
use crate::secret::SecretValue;

/// The port of E2B's MCP gateway in a sandbox.
pub const MCP_PORT: u16 = 50005;

/// Where the gateway keeps its token, readable by root only.
const MCP_TOKEN_PATH: &str = "/etc/mcp-gateway/.token";

/// The gateway's token is a line of text; anything larger is not one.
const MCP_TOKEN_LIMIT: u64 = 64 * 1024;

impl Sandbox {
    /// The MCP gateway's URL (the official SDK's `get_mcp_url`):
    /// `https://<50005-host>/mcp`, to give an MCP client with [`Sandbox::mcp_token`] as its
    /// bearer.
    pub fn mcp_url(&self) -> String {
        format!("https://{}/mcp", self.host(MCP_PORT))
    }

    /// The MCP gateway's token (the official SDK's `get_mcp_token`), read from the sandbox
    /// as root; `None` when the sandbox has no gateway (the file is missing). The value is a
    /// [`SecretValue`]: its `Debug` hides it.
    pub async fn mcp_token(&self) -> Result<Option<SecretValue>, Error> {
        let as_root = self.with_user("root".to_owned());
        match as_root.read_file(MCP_TOKEN_PATH, MCP_TOKEN_LIMIT).await {
            Ok(bytes) => Ok(Some(SecretValue::new(
                String::from_utf8_lossy(&bytes).trim().to_owned(),
            ))),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }
}
