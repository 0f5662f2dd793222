//! URLs for envd's `/files` that work without any header, signed with the sandbox's access
//! token as the official SDK's `download_url` / `upload_url` sign them, for handing a file
//! transfer to a browser, `curl` or another process.

use std::fmt;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use percent_encoding::utf8_percent_encode;
use sha2::{Digest, Sha256};

use super::Sandbox;
use crate::error::{Error, Operation};
use crate::http::UNRESERVED;
use crate::redact::redact;

/// A `/files` URL. While its signature is valid it grants what the sandbox's token grants
/// for that one file, so it is treated like a credential: `Debug` hides the signature and
/// there is no `Display`; [`FileUrl::expose`] gives the URL to pass on.
#[derive(Clone, PartialEq, Eq)]
pub struct FileUrl(String);

impl FileUrl {
    /// The URL itself, for the one place that hands it out.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for FileUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileUrl({})", redact(&self.0))
    }
}

/// What a signature grants (the word signed).
#[derive(Clone, Copy)]
enum Grant {
    Read,
    Write,
}

impl Grant {
    fn as_str(self) -> &'static str {
        match self {
            Grant::Read => "read",
            Grant::Write => "write",
        }
    }
}

/// `v1_` + unpadded base64 of sha256(`path:operation:user:token[:expiration]`), the user
/// empty for the default one: the SDK's `get_signature`.
fn signature(path: &str, grant: Grant, user: &str, token: &str, expiration: Option<u64>) -> String {
    let mut raw = format!("{path}:{}:{user}:{token}", grant.as_str());
    if let Some(expiration) = expiration {
        raw.push_str(&format!(":{expiration}"));
    }
    format!(
        "v1_{}",
        STANDARD_NO_PAD.encode(Sha256::digest(raw.as_bytes()))
    )
}

impl Sandbox {
    /// A URL that downloads `path` with a plain `GET`, as the SDK's `download_url`: signed
    /// when the sandbox has an access token (valid until `expires_in` from now, or for the
    /// token's life), plain otherwise. Made as [`Sandbox::with_user`]'s user when set.
    pub fn download_url(&self, path: &str, expires_in: Option<Duration>) -> Result<FileUrl, Error> {
        self.file_url(path, Grant::Read, expires_in)
    }

    /// A URL that uploads to `path` with a `POST` of a `multipart/form-data` body (or an
    /// `application/octet-stream` one), as the SDK's `upload_url`; signed like
    /// [`Sandbox::download_url`].
    pub fn upload_url(&self, path: &str, expires_in: Option<Duration>) -> Result<FileUrl, Error> {
        self.file_url(path, Grant::Write, expires_in)
    }

    fn file_url(
        &self,
        path: &str,
        grant: Grant,
        expires_in: Option<Duration>,
    ) -> Result<FileUrl, Error> {
        let ctx = self.ctx(Operation::FileUrl);
        if path.is_empty() {
            return Err(ctx.invalid_input("the path is empty"));
        }
        let mut query = vec![format!("path={}", utf8_percent_encode(path, UNRESERVED))];
        if let Some(user) = &self.user {
            query.push(format!(
                "username={}",
                utf8_percent_encode(user, UNRESERVED)
            ));
        }
        match (&self.token, expires_in) {
            (None, Some(_)) => {
                return Err(ctx.invalid_input(
                    "an expiry needs a signed URL, and this sandbox has no access token",
                ));
            }
            (None, None) => {}
            (Some(token), expires_in) => {
                let expiration = match expires_in {
                    None => None,
                    Some(after) => {
                        let now = SystemTime::now()
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map_err(|_| ctx.invalid_input("the system clock is before 1970"))?;
                        Some(now.saturating_add(after).as_secs())
                    }
                };
                let user = self.user.as_deref().unwrap_or_default();
                let signed = signature(path, grant, user, token.expose(), expiration);
                query.push(format!(
                    "signature={}",
                    utf8_percent_encode(&signed, UNRESERVED)
                ));
                if let Some(expiration) = expiration {
                    query.push(format!("signature_expiration={expiration}"));
                }
            }
        }
        Ok(FileUrl(format!(
            "{}/files?{}",
            self.direct,
            query.join("&")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_the_sdks() {
        // Python: "v1_" + base64(sha256(b"/a:read::tok")).rstrip("=")
        assert_eq!(
            signature("/a", Grant::Read, "", "tok", None),
            "v1_2/gNbgFPxFSqkheS/SD0NHlzA121E/nxkOtc/ovxeoI"
        );
        assert_ne!(
            signature("/a", Grant::Read, "", "tok", None),
            signature("/a", Grant::Write, "", "tok", None)
        );
        assert_ne!(
            signature("/a", Grant::Read, "", "tok", None),
            signature("/a", Grant::Read, "", "tok", Some(1))
        );
    }

    #[test]
    fn debug_hides_the_signature() {
        let url = FileUrl("http://127.0.0.1:1/files?path=a&signature=v1_SECRETSIG".to_owned());
        let shown = format!("{url:?}");
        assert!(!shown.contains("SECRETSIG"), "{shown}");
        assert!(shown.contains("path=a"), "{shown}");
    }
}
