//! E2B Secrets: named values the team stores once and header rules name by placeholder.
//!
//! Kept in `<state_dir>/secrets.json`, owner-only (0600), written to a temporary file and
//! renamed, so a restart finds every secret and a crash never leaves half a record. Values
//! are write-only as on E2B: every answer is [`Stored::info_json`], which has no value, and
//! no error message quotes one. Header rules name a secret as `${e2b.secrets.<name>}`; the
//! egress proxy resolves it at each request ([`Secrets::resolve`]).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use http::StatusCode;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::clock::{Clock, nanos, rfc3339};
use crate::reply::ApiError;

const FILE: &str = "secrets.json";

/// E2B reserves this prefix for ids, so no name starts with it.
const ID_PREFIX: &str = "sec_";

/// E2B's spec: names of 1 to 128 characters, metadata of at most 32 entries, keys of at
/// most 128 bytes, values of at most 1024 and 8192 bytes in all.
const MAX_NAME: usize = 128;
const MAX_METADATA_ENTRIES: usize = 32;
const MAX_METADATA_KEY: usize = 128;
const MAX_METADATA_VALUE: usize = 1024;
const MAX_METADATA_TOTAL: usize = 8192;

/// One secret as persisted; its value leaves this module only through
/// [`Secrets::resolve`], for the egress proxy.
#[derive(Clone, Serialize, Deserialize)]
struct Stored {
    id: String,
    name: String,
    value: String,
    version: u64,
    metadata: BTreeMap<String, String>,
    /// Unix nanoseconds.
    created_at: u64,
    updated_at: u64,
    /// Creation order: the list's order and its cursor.
    seq: u64,
}

impl Stored {
    /// The answer E2B gives for a secret: metadata only.
    fn info_json(&self) -> Value {
        json!({
            "secretID": self.id,
            "name": self.name,
            "currentVersion": self.version,
            "metadata": self.metadata,
            "createdAt": rfc3339(self.created_at),
            "updatedAt": rfc3339(self.updated_at),
        })
    }
}

#[derive(Default, Serialize, Deserialize)]
struct Index {
    next_seq: u64,
    secrets: Vec<Stored>,
}

impl Index {
    fn find(&self, selector: &str) -> Option<usize> {
        let name = selector.to_ascii_lowercase();
        self.secrets
            .iter()
            .position(|secret| secret.id == selector || secret.name == name)
    }
}

/// What a create or update asks for, checked.
pub(crate) struct Write {
    value: String,
    metadata: Option<BTreeMap<String, String>>,
}

/// The team's secrets.
pub(crate) struct Secrets {
    path: PathBuf,
    clock: Clock,
    index: Mutex<Index>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Secrets {
    /// Opens (or starts) the record under `state_dir`, making it owner-only if an older
    /// one was not.
    pub(crate) fn open(state_dir: &Path, clock: Clock) -> io::Result<Secrets> {
        let path = state_dir.join(FILE);
        let index = crate::private_json::load(&path)?;
        Ok(Secrets {
            path,
            clock,
            index: Mutex::new(index),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the whole record; an error names the file, never a value.
    fn persist(&self, index: &Index) -> Result<(), ApiError> {
        crate::private_json::store(&self.path, index).map_err(|error| {
            tracing::warn!(path = %self.path.display(), %error, "persisting secrets failed");
            ApiError::internal(format!("storing secrets failed: {}", error.kind()))
        })
    }

    /// `POST /secrets`: 201 with the new secret's metadata.
    pub(crate) fn create(&self, body: &Value) -> Result<Value, ApiError> {
        let name = match body.get("name") {
            Some(Value::String(name)) => canonical_name(name)?,
            Some(_) => return Err(ApiError::bad_request("name: must be a string")),
            None => return Err(ApiError::bad_request("name: is required")),
        };
        let write = parse_write(body)?;
        let now = nanos(self.clock.now());
        let mut index = self.lock();
        if index.secrets.iter().any(|secret| secret.name == name) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("Secret with name '{name}' already exists"),
            ));
        }
        let seq = index.next_seq;
        let stored = Stored {
            id: new_id(),
            name,
            value: write.value,
            version: 1,
            metadata: write.metadata.unwrap_or_default(),
            created_at: now,
            updated_at: now,
            seq,
        };
        let info = stored.info_json();
        let mut next = Index {
            next_seq: seq + 1,
            secrets: index.secrets.clone(),
        };
        next.secrets.push(stored);
        self.persist(&next)?;
        *index = next;
        Ok(info)
    }

    /// `GET /secrets`: one page in creation order, and the next page's token.
    pub(crate) fn list(
        &self,
        limit: usize,
        token: Option<&str>,
    ) -> Result<(Vec<Value>, Option<String>), ApiError> {
        let after = match token {
            None => 0,
            Some(token) => token
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request("nextToken: invalid"))?,
        };
        let index = self.lock();
        let mut rest = index.secrets.iter().filter(|secret| secret.seq >= after);
        let page: Vec<Value> = rest.by_ref().take(limit).map(Stored::info_json).collect();
        let next = rest.next().map(|secret| secret.seq.to_string());
        Ok((page, next))
    }

    /// `GET /secrets/{id or name}`.
    pub(crate) fn get(&self, selector: &str) -> Result<Value, ApiError> {
        let index = self.lock();
        let at = index.find(selector).ok_or_else(|| not_found(selector))?;
        Ok(index.secrets[at].info_json())
    }

    /// `POST /secrets/{id or name}`: a new version of the value (and new metadata when
    /// given).
    pub(crate) fn update(&self, selector: &str, body: &Value) -> Result<Value, ApiError> {
        let write = parse_write(body)?;
        let now = nanos(self.clock.now());
        let mut index = self.lock();
        let at = index.find(selector).ok_or_else(|| not_found(selector))?;
        let mut next = Index {
            next_seq: index.next_seq,
            secrets: index.secrets.clone(),
        };
        let secret = &mut next.secrets[at];
        secret.value = write.value;
        secret.version += 1;
        if let Some(metadata) = write.metadata {
            secret.metadata = metadata;
        }
        // Never before creation, even if the clock was set back.
        secret.updated_at = now.max(secret.created_at);
        let info = secret.info_json();
        self.persist(&next)?;
        *index = next;
        Ok(info)
    }

    /// `DELETE /secrets/{id or name}`.
    pub(crate) fn delete(&self, selector: &str) -> Result<(), ApiError> {
        let mut index = self.lock();
        let at = index.find(selector).ok_or_else(|| not_found(selector))?;
        let mut next = Index {
            next_seq: index.next_seq,
            secrets: index.secrets.clone(),
        };
        next.secrets.remove(at);
        self.persist(&next)?;
        *index = next;
        Ok(())
    }

    /// `text` with every `${e2b.secrets.<name>}` replaced by that secret's current value
    /// (text around a placeholder is kept), for the egress proxy at each request; the
    /// error names a secret that does not exist (never a value).
    pub(crate) fn resolve(&self, text: &str) -> Result<String, String> {
        if !text.contains(PLACEHOLDER_START) {
            return Ok(text.to_owned());
        }
        let index = self.lock();
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(PLACEHOLDER_START) {
            out.push_str(&rest[..at]);
            let after = &rest[at + PLACEHOLDER_START.len()..];
            let Some(end) = after.find('}') else {
                return Err("a secret placeholder is not closed with '}'".to_owned());
            };
            let name = after[..end].to_ascii_lowercase();
            let secret = index
                .secrets
                .iter()
                .find(|secret| secret.name == name)
                .ok_or_else(|| format!("the secret '{}' does not exist", shown(&name)))?;
            out.push_str(&secret.value);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

/// What opens a placeholder; `}` closes it.
const PLACEHOLDER_START: &str = "${e2b.secrets.";

/// A name from a rule, cut and stripped of control characters for an error message.
fn shown(name: &str) -> String {
    name.chars()
        .filter(|c| !c.is_control())
        .take(MAX_NAME)
        .collect()
}

fn not_found(selector: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Secret '{selector}' not found"),
    )
}

fn new_id() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{ID_PREFIX}{hex}")
}

/// A name as E2B stores it (lower-cased), or E2B's 400 naming the field.
fn canonical_name(name: &str) -> Result<String, ApiError> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(ApiError::bad_request(format!(
            "name: must have 1 to {MAX_NAME} characters"
        )));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(ApiError::bad_request("name: must match ^[a-zA-Z0-9_-]+$"));
    }
    let name = name.to_ascii_lowercase();
    if name.starts_with(ID_PREFIX) {
        return Err(ApiError::bad_request(format!(
            "name: the prefix '{ID_PREFIX}' is reserved for secret identifiers"
        )));
    }
    Ok(name)
}

/// The value and metadata of a create or update body. Fields are read one by one, not
/// through serde, so no parse error can quote the value back.
fn parse_write(body: &Value) -> Result<Write, ApiError> {
    let value = match body.get("value") {
        Some(Value::String(value)) => value.clone(),
        Some(_) => return Err(ApiError::bad_request("value: must be a string")),
        None => return Err(ApiError::bad_request("value: is required")),
    };
    let metadata = match body.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(parse_metadata(map)?),
        Some(_) => return Err(ApiError::bad_request("metadata: must be an object")),
    };
    Ok(Write { value, metadata })
}

fn parse_metadata(
    map: &serde_json::Map<String, Value>,
) -> Result<BTreeMap<String, String>, ApiError> {
    if map.len() > MAX_METADATA_ENTRIES {
        return Err(ApiError::bad_request(format!(
            "metadata: at most {MAX_METADATA_ENTRIES} entries"
        )));
    }
    let mut out = BTreeMap::new();
    let mut total = 0;
    for (key, value) in map {
        let Value::String(value) = value else {
            return Err(ApiError::bad_request("metadata: values must be strings"));
        };
        if key.len() > MAX_METADATA_KEY || value.len() > MAX_METADATA_VALUE {
            return Err(ApiError::bad_request(format!(
                "metadata: keys have at most {MAX_METADATA_KEY} bytes, values {MAX_METADATA_VALUE}"
            )));
        }
        total += key.len() + value.len();
        out.insert(key.clone(), value.clone());
    }
    if total > MAX_METADATA_TOTAL {
        return Err(ApiError::bad_request(format!(
            "metadata: at most {MAX_METADATA_TOTAL} bytes in all"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_resolve_to_current_values_with_the_text_around_kept() {
        // contract: X21
        let dir = tempfile::tempdir().unwrap();
        let secrets = Secrets::open(dir.path(), Clock::system()).unwrap();
        secrets
            .create(&json!({"name": "GH", "value": "v1-secret"}))
            .unwrap();
        secrets
            .create(&json!({"name": "other", "value": "o-secret"}))
            .unwrap();
        assert_eq!(secrets.resolve("plain").unwrap(), "plain");
        assert_eq!(
            secrets.resolve("Bearer ${e2b.secrets.gh}").unwrap(),
            "Bearer v1-secret"
        );
        assert_eq!(
            secrets
                .resolve("${e2b.secrets.GH}:${e2b.secrets.other};")
                .unwrap(),
            "v1-secret:o-secret;"
        );
        secrets
            .update("gh", &json!({"value": "v2-secret"}))
            .unwrap();
        assert_eq!(
            secrets.resolve("token ${e2b.secrets.gh}").unwrap(),
            "token v2-secret"
        );
        for (text, why) in [
            (
                "Bearer ${e2b.secrets.nope}",
                "the secret 'nope' does not exist",
            ),
            (
                "Bearer ${e2b.secrets.gh",
                "a secret placeholder is not closed with '}'",
            ),
        ] {
            let error = secrets.resolve(text).unwrap_err();
            assert_eq!(error, why);
        }
    }
}
