//! Snapshots and forks: persistent captures of a sandbox that new sandboxes start from.
//!
//! A snapshot is a template to E2B: create a sandbox from it with
//! [`CreateOptions::new`](crate::CreateOptions::new)`(snapshot_id or name)`, delete it through
//! the templates route.

use std::time::Duration;

use futures::Stream;
use percent_encoding::utf8_percent_encode;
use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::{Client, SandboxInfo, whole_secs};
use crate::error::{Error, Operation};
use crate::http::UNRESERVED;
use crate::ids::SandboxId;
use crate::json;
use crate::retry::Idempotency;

/// The most forks one request may ask for (E2B's spec: 1 to 100).
const MAX_FORKS: u32 = 100;

/// A snapshot as E2B describes it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct SnapshotInfo {
    /// What to create a sandbox from: `namespace/name:tag` when the snapshot was named, else
    /// `<template id>:default`.
    #[serde(rename = "snapshotID", alias = "snapshotId", alias = "snapshot_id")]
    pub snapshot_id: String,
    /// The snapshot's full names (`namespace/name:tag`); empty when unnamed.
    #[serde(default, deserialize_with = "json::null_default")]
    pub names: Vec<String>,
}

/// A snapshot filter. Start from [`SnapshotQuery::all`].
#[derive(Clone, Debug)]
pub struct SnapshotQuery {
    /// Only snapshots taken of this sandbox.
    pub sandbox_id: Option<SandboxId>,
    /// Only snapshots with this name or id, optionally tag-qualified (`name`, `team/name`,
    /// `name:v1`).
    pub name: Option<String>,
    /// Page size; `None` sends 100, as the official SDK does.
    pub limit: Option<u32>,
}

impl SnapshotQuery {
    /// Every snapshot of the team, 100 per page.
    pub fn all() -> SnapshotQuery {
        SnapshotQuery {
            sandbox_id: None,
            name: None,
            limit: None,
        }
    }
}

/// The result of [`Client::delete_snapshot`], [`Client::delete_secret`] and
/// [`Client::delete_volume`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeleteOutcome {
    /// Deleted now.
    Deleted,
    /// HTTP 404: no such snapshot, secret or volume (already gone).
    NotFound,
}

/// What [`Client::fork`] creates; there is no `Default`.
#[derive(Clone, Debug)]
pub struct ForkOptions {
    /// How many sandboxes (1 to 100).
    pub count: u32,
    /// Each fork's first lease.
    pub timeout: Duration,
}

#[derive(Serialize)]
struct SnapshotBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

#[derive(Serialize)]
struct ForkBody {
    timeout: u64,
    count: u32,
}

/// One entry of a fork's answer: exactly one of the two is set.
#[derive(Deserialize)]
struct ForkEntry {
    #[serde(default)]
    sandbox: Option<SandboxInfo>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

impl Client {
    /// Snapshots a sandbox (`POST /sandboxes/{id}/snapshots`): its filesystem and (on E2B)
    /// memory, kept after the sandbox is gone. E2B pauses the sandbox briefly and resumes it,
    /// keeping its id and lease. A `name` that exists already gets the new content under the
    /// same template. Not retried once the request may have reached E2B, so a lost answer
    /// never makes two snapshots; find it with [`Client::list_snapshots`] instead. A 404 is
    /// [`Error::is_sandbox_gone`].
    pub async fn create_snapshot(
        &self,
        sandbox_id: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotInfo, Error> {
        let ctx = self.ctx(Operation::CreateSnapshot, Some(sandbox_id));
        let path = format!("/sandboxes/{sandbox_id}/snapshots");
        // The SDK leaves an empty name out; so does this.
        let body = SnapshotBody {
            name: name.filter(|name| !name.is_empty()),
        };
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                &path,
                Some(&body),
                Idempotency::NotIdempotent,
            )
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Lists snapshots (`GET /snapshots`) as a stream of items, fetching the next page
    /// (following `X-Next-Token`) only when the previous one is consumed.
    pub fn list_snapshots(
        &self,
        query: SnapshotQuery,
    ) -> impl Stream<Item = Result<SnapshotInfo, Error>> + Send + 'static {
        self.paged(
            Operation::ListSnapshots,
            "/snapshots",
            snapshot_query_string(&query),
        )
    }

    /// Deletes a snapshot by its id or name (`DELETE /templates/{id}`, the id encoded as one
    /// path segment as the official SDK does). A 404 is [`DeleteOutcome::NotFound`].
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<DeleteOutcome, Error> {
        let ctx = self.ctx(Operation::DeleteSnapshot, None);
        if snapshot_id.is_empty() {
            return Err(ctx.invalid_input("the snapshot id is empty"));
        }
        let path = format!(
            "/templates/{}",
            utf8_percent_encode(snapshot_id, UNRESERVED)
        );
        match self
            .send_json::<()>(&ctx, Method::DELETE, &path, None, Idempotency::Idempotent)
            .await
        {
            Ok(_) => Ok(DeleteOutcome::Deleted),
            Err(error) if error.is_not_found() => Ok(DeleteOutcome::NotFound),
            Err(error) => Err(error),
        }
    }

    /// Whether a template of this name exists for the team (`GET /templates/aliases/{alias}`,
    /// the SDK's `Template.exists`): a public template, one of the team's, or a snapshot by
    /// name. A 403 (the name exists, another team owns it) is `true`, as the SDK reads it.
    pub async fn template_exists(&self, name: &str) -> Result<bool, Error> {
        let ctx = self.ctx(Operation::TemplateExists, None);
        if name.is_empty() {
            return Err(ctx.invalid_input("the template name is empty"));
        }
        let path = format!(
            "/templates/aliases/{}",
            utf8_percent_encode(name, UNRESERVED)
        );
        match self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if error.status() == Some(403) => Ok(true),
            Err(error) if error.is_not_found() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Forks a sandbox (`POST /sandboxes/{id}/fork`): E2B snapshots it once (the source keeps
    /// its id and lease) and starts `count` sandboxes from that snapshot. The outer error is
    /// the request's (a 404 is [`Error::is_sandbox_gone`]); otherwise there is one entry per
    /// fork, each the new sandbox or why that fork did not start ([`Operation::StartFork`],
    /// naming the source). Not retried once the request may have reached E2B, so a lost
    /// answer never doubles the forks.
    pub async fn fork(
        &self,
        sandbox_id: &SandboxId,
        options: ForkOptions,
    ) -> Result<Vec<Result<SandboxInfo, Error>>, Error> {
        let ctx = self.ctx(Operation::Fork, Some(sandbox_id));
        if !(1..=MAX_FORKS).contains(&options.count) {
            return Err(ctx.invalid_input(format!(
                "a fork count must be between 1 and {MAX_FORKS}, not {}",
                options.count
            )));
        }
        let path = format!("/sandboxes/{sandbox_id}/fork");
        let body = ForkBody {
            timeout: whole_secs(options.timeout),
            count: options.count,
        };
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                &path,
                Some(&body),
                Idempotency::NotIdempotent,
            )
            .await?;
        let entries: Vec<ForkEntry> = self.inner.http.read_json(&ctx, response, deadline).await?;
        let start_ctx = self.ctx(Operation::StartFork, Some(sandbox_id));
        let mut results: Vec<Result<SandboxInfo, Error>> = entries
            .into_iter()
            .map(|entry| match (entry.sandbox, entry.error) {
                (Some(sandbox), None) => Ok(sandbox),
                (_, Some(error)) => Err(entry_error(&start_ctx, &error)),
                (None, None) => {
                    Err(start_ctx.protocol("a fork entry had neither sandbox nor error"))
                }
            })
            .collect();
        // One entry per requested fork, so a caller can count on the shape; a short answer
        // says which forks are unaccounted for rather than dropping the ones that started.
        let requested = usize::try_from(options.count).unwrap_or(usize::MAX);
        while results.len() < requested {
            results.push(Err(
                start_ctx.protocol("the server sent no result for this fork")
            ));
        }
        Ok(results)
    }
}

/// A fork entry's `{code, message}` as the error of that fork, read as any error body is.
fn entry_error(ctx: &crate::http::Ctx, error: &serde_json::Value) -> Error {
    let status = error
        .get("code")
        .and_then(serde_json::Value::as_u64)
        .and_then(|code| u16::try_from(code).ok())
        .unwrap_or(500);
    ctx.response_error(status, error.to_string().as_bytes())
}

/// The snapshot list query (without the page token) in the official SDK's order.
fn snapshot_query_string(query: &SnapshotQuery) -> String {
    let mut parts = Vec::new();
    if let Some(sandbox_id) = &query.sandbox_id {
        parts.push(format!(
            "sandboxID={}",
            utf8_percent_encode(sandbox_id.as_str(), UNRESERVED)
        ));
    }
    if let Some(name) = query.name.as_deref().filter(|name| !name.is_empty()) {
        parts.push(format!("name={}", utf8_percent_encode(name, UNRESERVED)));
    }
    parts.push(format!("limit={}", query.limit.unwrap_or(100)));
    parts.join("&")
}
