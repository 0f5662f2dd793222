//! E2B Secrets: named values the egress proxy puts into a sandbox's outgoing requests where a
//! header rule says `${e2b.secrets.<name>}`. Values are write-only: E2B's answers carry
//! metadata only, and so do this module's types.

use std::collections::BTreeMap;

use futures::Stream;
use percent_encoding::utf8_percent_encode;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::{Client, DeleteOutcome};
use crate::error::{Error, Operation};
use crate::http::{Ctx, UNRESERVED};
use crate::json;
use crate::retry::Idempotency;
use crate::secret::SecretValue;

/// The longest secret name E2B takes (its spec: 1 to 128 characters).
pub const MAX_SECRET_NAME: usize = 128;

/// The prefix of secret ids; E2B reserves it, so no name may start with it.
const ID_PREFIX: &str = "sec_";

/// E2B's metadata limits: entries, key bytes, value bytes, bytes in all.
const MAX_METADATA_ENTRIES: usize = 32;
const MAX_METADATA_KEY: usize = 128;
const MAX_METADATA_VALUE: usize = 1024;
const MAX_METADATA_TOTAL: usize = 8192;

/// A secret as E2B describes it: never its value.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct SecretInfo {
    /// E2B's id (`sec_…`).
    #[serde(rename = "secretID", alias = "secretId", alias = "secret_id")]
    pub secret_id: String,
    /// The canonical (lower-case) name.
    pub name: String,
    /// The version readers get; 1 after create, one more per update.
    #[serde(rename = "currentVersion", deserialize_with = "json::int")]
    pub current_version: u64,
    /// The caller's metadata; empty when none was set.
    #[serde(default, deserialize_with = "json::null_default")]
    pub metadata: BTreeMap<String, String>,
    /// When it was created.
    #[serde(rename = "createdAt", deserialize_with = "json::rfc3339")]
    pub created_at: time::OffsetDateTime,
    /// When its value or metadata last changed.
    #[serde(rename = "updatedAt", deserialize_with = "json::rfc3339")]
    pub updated_at: time::OffsetDateTime,
}

/// What [`Client::create_secret`] stores; there is no `Default`.
#[derive(Clone, Debug)]
pub struct NewSecret {
    /// Letters, digits, `_` and `-`, 1 to 128 of them, not starting with `sec_`; E2B keeps
    /// it lower-cased (see [`canonical_secret_name`]).
    pub name: String,
    /// The value; sent once, never read back.
    pub value: SecretValue,
    /// Up to 32 entries; `None` sends none.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// What [`Client::update_secret`] changes; there is no `Default`. E2B's update always
/// carries a value (it appends a version), so a metadata-only change is not possible.
#[derive(Clone, Debug)]
pub struct SecretUpdate {
    /// The new value.
    pub value: SecretValue,
    /// `Some` replaces the stored metadata; `None` keeps it.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// Which secrets [`Client::list_secrets`] pages through.
#[derive(Clone, Debug)]
pub struct SecretQuery {
    /// Page size (1 to 100); `None` leaves it to the server (100).
    pub limit: Option<u32>,
}

impl SecretQuery {
    /// Every secret of the team, the server's page size.
    pub fn all() -> SecretQuery {
        SecretQuery { limit: None }
    }
}

/// The name E2B stores for `name` (lower-cased), or why E2B would refuse it.
pub fn canonical_secret_name(name: &str) -> Result<String, String> {
    if name.is_empty() || name.len() > MAX_SECRET_NAME {
        return Err(format!(
            "name: a secret name has 1 to {MAX_SECRET_NAME} characters, not {}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "name: a secret name has only letters, digits, '_' and '-', not {bad:?}"
        ));
    }
    let canonical = name.to_ascii_lowercase();
    if canonical.starts_with(ID_PREFIX) {
        return Err(format!(
            "name: the prefix {ID_PREFIX:?} is reserved for secret ids"
        ));
    }
    Ok(canonical)
}

/// The placeholder a header rule's value carries for secret `name`: E2B's egress proxy puts
/// the secret's current value in its place at each request.
pub fn secret_placeholder(name: &str) -> Result<String, String> {
    canonical_secret_name(name).map(|name| format!("${{e2b.secrets.{name}}}"))
}

/// A secret's id, or its name in canonical form: what the `/secrets/{secretID}` routes take.
fn selector(ctx: &Ctx, secret: &str) -> Result<String, Error> {
    if secret.starts_with(ID_PREFIX) {
        return Ok(secret.to_owned());
    }
    canonical_secret_name(secret).map_err(|reason| ctx.invalid_input(reason))
}

fn check_metadata(ctx: &Ctx, metadata: &BTreeMap<String, String>) -> Result<(), Error> {
    let fail = |reason: String| Err(ctx.invalid_input(format!("metadata: {reason}")));
    if metadata.len() > MAX_METADATA_ENTRIES {
        return fail(format!(
            "at most {MAX_METADATA_ENTRIES} entries, not {}",
            metadata.len()
        ));
    }
    let mut total = 0;
    for (key, value) in metadata {
        if key.len() > MAX_METADATA_KEY || value.len() > MAX_METADATA_VALUE {
            return fail(format!(
                "keys have at most {MAX_METADATA_KEY} bytes and values {MAX_METADATA_VALUE}"
            ));
        }
        total += key.len() + value.len();
    }
    if total > MAX_METADATA_TOTAL {
        return fail(format!("at most {MAX_METADATA_TOTAL} bytes in all"));
    }
    Ok(())
}

#[derive(Serialize)]
struct NewSecretBody<'a> {
    name: &'a str,
    value: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a BTreeMap<String, String>>,
}

#[derive(Serialize)]
struct SecretUpdateBody<'a> {
    value: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<&'a BTreeMap<String, String>>,
}

impl Client {
    /// Creates a secret (`POST /secrets`); the answer is its metadata. A taken name is
    /// [`Error::is_name_taken`]; a name or metadata E2B would refuse is refused here, before
    /// sending. Not retried once the request may have reached E2B (a retry would meet its own
    /// name). No error's text carries the value.
    pub async fn create_secret(&self, secret: NewSecret) -> Result<SecretInfo, Error> {
        let ctx = self
            .ctx(Operation::CreateSecret, None)
            .with_secrets(vec![secret.value.clone()]);
        let name =
            canonical_secret_name(&secret.name).map_err(|reason| ctx.invalid_input(reason))?;
        if let Some(metadata) = &secret.metadata {
            check_metadata(&ctx, metadata)?;
        }
        let body = NewSecretBody {
            name: &name,
            value: secret.value.expose(),
            metadata: secret.metadata.as_ref(),
        };
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                "/secrets",
                Some(&body),
                Idempotency::NotIdempotent,
            )
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Lists the team's secrets (`GET /secrets`) as a stream of items, fetching the next page
    /// (following `X-Next-Token`) only when the previous one is consumed.
    pub fn list_secrets(
        &self,
        query: SecretQuery,
    ) -> impl Stream<Item = Result<SecretInfo, Error>> + Send + 'static {
        let base_query = query
            .limit
            .map(|limit| format!("limit={limit}"))
            .unwrap_or_default();
        self.paged(Operation::ListSecrets, "/secrets", base_query)
    }

    /// Reads one secret's metadata (`GET /secrets/{id or name}`). A 404 is
    /// [`Error::is_not_found`].
    pub async fn get_secret(&self, secret: &str) -> Result<SecretInfo, Error> {
        let ctx = self.ctx(Operation::GetSecret, None);
        let path = secret_path(&selector(&ctx, secret)?);
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Whether the team has a secret of this id or name (a `GET` that finds it), as the
    /// SDK's `Secret.exists`; any failure other than a 404 is an error.
    pub async fn secret_exists(&self, secret: &str) -> Result<bool, Error> {
        match self.get_secret(secret).await {
            Ok(_) => Ok(true),
            Err(error) if error.is_not_found() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Stores a new value (and, when given, new metadata) for a secret
    /// (`POST /secrets/{id or name}`); the answer carries the new version. Every sandbox whose
    /// rules name the secret gets the new value at its next request. A 404 is
    /// [`Error::is_not_found`]. Retried like a read: a repeat stores the same value again.
    pub async fn update_secret(
        &self,
        secret: &str,
        update: SecretUpdate,
    ) -> Result<SecretInfo, Error> {
        let ctx = self
            .ctx(Operation::UpdateSecret, None)
            .with_secrets(vec![update.value.clone()]);
        let path = secret_path(&selector(&ctx, secret)?);
        if let Some(metadata) = &update.metadata {
            check_metadata(&ctx, metadata)?;
        }
        let body = SecretUpdateBody {
            value: update.value.expose(),
            metadata: update.metadata.as_ref(),
        };
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                &path,
                Some(&body),
                Idempotency::Idempotent,
            )
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Deletes a secret (`DELETE /secrets/{id or name}`). A 404 is
    /// [`DeleteOutcome::NotFound`].
    pub async fn delete_secret(&self, secret: &str) -> Result<DeleteOutcome, Error> {
        let ctx = self.ctx(Operation::DeleteSecret, None);
        let path = secret_path(&selector(&ctx, secret)?);
        match self
            .send_json::<()>(&ctx, Method::DELETE, &path, None, Idempotency::Idempotent)
            .await
        {
            Ok(_) => Ok(DeleteOutcome::Deleted),
            Err(error) if error.is_not_found() => Ok(DeleteOutcome::NotFound),
            Err(error) => Err(error),
        }
    }
}

fn secret_path(selector: &str) -> String {
    format!("/secrets/{}", utf8_percent_encode(selector, UNRESERVED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_cased_and_checked_as_e2b_does() {
        assert_eq!(
            canonical_secret_name("GitHub_Token-1").as_deref(),
            Ok("github_token-1")
        );
        assert_eq!(secret_placeholder("GH").as_deref(), Ok("${e2b.secrets.gh}"));
        for bad in ["", "a b", "a.b", "x}", "Sec_abc", "sec_abc", "é"] {
            let reason = canonical_secret_name(bad).expect_err(bad);
            assert!(reason.starts_with("name: "), "{reason}");
        }
        assert!(canonical_secret_name(&"a".repeat(MAX_SECRET_NAME)).is_ok());
        assert!(canonical_secret_name(&"a".repeat(MAX_SECRET_NAME + 1)).is_err());
    }
}
