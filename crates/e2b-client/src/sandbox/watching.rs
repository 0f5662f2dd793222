//! envd's directory watches (`filesystem.Filesystem`): a stream, or a watcher polled for events.

use serde::{Deserialize, Serialize};

use super::Sandbox;
use crate::error::{Error, Operation};
use crate::json;
use crate::retry::Idempotency;
use crate::watch::{
    EventEntries, FsEvent, RawFsEvent, WatchDepth, WatchOptions, WatchStream, WatcherId,
};

impl Sandbox {
    /// Watches a directory (`filesystem.Filesystem/WatchDir`) and returns its event stream once
    /// envd confirmed the watch: a missing path is an error with [`Error::is_not_found`], a file
    /// is refused. Memory stays bounded however long it runs (see [`WatchStream`]).
    pub async fn watch_dir(&self, path: &str, options: WatchOptions) -> Result<WatchStream, Error> {
        let message = WatchRequest {
            include_entry: options.entries == EventEntries::Included,
            ..WatchRequest::new(path, options.depth)
        };
        let reader = self
            .open_stream(
                Operation::WatchDir,
                "filesystem.Filesystem/WatchDir",
                &message,
                self.user.as_deref(),
                options.timeout,
                options.keepalive,
            )
            .await?;
        WatchStream::open(reader).await
    }

    /// Starts a watcher that envd keeps until removed (`filesystem.Filesystem/CreateWatcher`,
    /// what the official sync SDK's `watch_dir` uses); fetch its events with
    /// [`Sandbox::watcher_events`]. Not retried once sent, so no second watcher is left behind.
    pub async fn create_watcher(&self, path: &str, depth: WatchDepth) -> Result<WatcherId, Error> {
        let reply: CreateWatcherReply = self
            .rpc(
                Operation::CreateWatcher,
                "filesystem.Filesystem/CreateWatcher",
                &WatchRequest::new(path, depth),
                Idempotency::NotIdempotent,
            )
            .await?;
        Ok(WatcherId(reply.watcher_id))
    }

    /// The events since the last call (`filesystem.Filesystem/GetWatcherEvents`); the answer is
    /// capped by [`crate::Limits::max_json_bytes`]. Not retried: envd hands each event out once.
    pub async fn watcher_events(&self, watcher: &WatcherId) -> Result<Vec<FsEvent>, Error> {
        let reply: WatcherEventsReply = self
            .rpc(
                Operation::GetWatcherEvents,
                "filesystem.Filesystem/GetWatcherEvents",
                &WatcherRequest {
                    watcher_id: &watcher.0,
                },
                Idempotency::NotIdempotent,
            )
            .await?;
        Ok(reply
            .events
            .into_iter()
            .map(RawFsEvent::into_event)
            .collect())
    }

    /// Removes a watcher (`filesystem.Filesystem/RemoveWatcher`); an unknown one is an error with
    /// [`Error::is_not_found`].
    pub async fn remove_watcher(&self, watcher: &WatcherId) -> Result<(), Error> {
        self.rpc::<_, serde::de::IgnoredAny>(
            Operation::RemoveWatcher,
            "filesystem.Filesystem/RemoveWatcher",
            &WatcherRequest {
                watcher_id: &watcher.0,
            },
            Idempotency::Idempotent,
        )
        .await
        .map(drop)
    }
}

#[derive(Serialize)]
struct WatchRequest<'a> {
    path: &'a str,
    recursive: bool,
    #[serde(rename = "includeEntry", skip_serializing_if = "std::ops::Not::not")]
    include_entry: bool,
}

impl WatchRequest<'_> {
    fn new(path: &str, depth: WatchDepth) -> WatchRequest<'_> {
        WatchRequest {
            path,
            recursive: depth == WatchDepth::Recursive,
            include_entry: false,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest<'a> {
    watcher_id: &'a str,
}

#[derive(Deserialize)]
struct CreateWatcherReply {
    #[serde(rename = "watcherId", alias = "watcher_id", default)]
    watcher_id: String,
}

#[derive(Deserialize)]
struct WatcherEventsReply {
    #[serde(default, deserialize_with = "json::null_default")]
    events: Vec<RawFsEvent>,
}
