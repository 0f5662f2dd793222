//! Sandbox metrics (`GET /sandboxes/{id}/metrics`).

use std::time::SystemTime;

use reqwest::Method;
use serde::Deserialize;

use super::Client;
use crate::error::{Error, Operation};
use crate::ids::SandboxId;
use crate::json;
use crate::retry::Idempotency;

/// One metrics sample of a sandbox (E2B's `SandboxMetric`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct SandboxMetric {
    /// When it was taken, in Unix seconds.
    #[serde(default, alias = "timestamp_unix", deserialize_with = "json::int")]
    pub timestamp_unix: i64,
    /// CPU cores of the sandbox.
    #[serde(default, alias = "cpu_count", deserialize_with = "json::int")]
    pub cpu_count: u32,
    /// CPU use, percent of all its cores.
    #[serde(default, alias = "cpu_used_pct")]
    pub cpu_used_pct: f64,
    /// Memory used, bytes.
    #[serde(default, alias = "mem_used", deserialize_with = "json::int")]
    pub mem_used: u64,
    /// Memory available, bytes.
    #[serde(default, alias = "mem_total", deserialize_with = "json::int")]
    pub mem_total: u64,
    /// Page cache, bytes.
    #[serde(default, alias = "mem_cache", deserialize_with = "json::int")]
    pub mem_cache: u64,
    /// Disk used, bytes.
    #[serde(default, alias = "disk_used", deserialize_with = "json::int")]
    pub disk_used: u64,
    /// Disk available, bytes.
    #[serde(default, alias = "disk_total", deserialize_with = "json::int")]
    pub disk_total: u64,
}

impl Client {
    /// The metrics samples of a sandbox between `start` and `end` (each optional; whole Unix
    /// seconds are sent), oldest first as E2B answers. An unknown sandbox is an error with
    /// [`Error::is_sandbox_gone`]; the answer is capped by [`crate::Limits::max_json_bytes`].
    pub async fn metrics(
        &self,
        sandbox_id: &SandboxId,
        start: Option<SystemTime>,
        end: Option<SystemTime>,
    ) -> Result<Vec<SandboxMetric>, Error> {
        let ctx = self.ctx(Operation::Metrics, Some(sandbox_id));
        let unix = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        let mut query = Vec::new();
        if let Some(start) = start {
            query.push(format!("start={}", unix(start)));
        }
        if let Some(end) = end {
            query.push(format!("end={}", unix(end)));
        }
        let mut path = format!("/sandboxes/{sandbox_id}/metrics");
        if !query.is_empty() {
            path = format!("{path}?{}", query.join("&"));
        }
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await?;
        let metrics: Option<Vec<SandboxMetric>> =
            self.inner.http.read_json(&ctx, response, deadline).await?;
        Ok(metrics.unwrap_or_default())
    }
}
