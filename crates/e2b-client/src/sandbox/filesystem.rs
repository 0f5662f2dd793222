//! envd's filesystem service (`filesystem.Filesystem`): stat, make, list, remove, move.

use serde::{Deserialize, Serialize};

use super::Sandbox;
use crate::error::{Error, Operation};
use crate::files::{EntryInfo, MakeDirOutcome};
use crate::json;
use crate::retry::Idempotency;

impl Sandbox {
    /// Describes one path (`filesystem.Filesystem/Stat`); a missing path is an error with
    /// [`Error::is_not_found`].
    pub async fn stat(&self, path: &str) -> Result<EntryInfo, Error> {
        let reply: EntryReply = self
            .rpc(
                Operation::Stat,
                "filesystem.Filesystem/Stat",
                &PathRequest { path },
                Idempotency::Idempotent,
            )
            .await?;
        Ok(reply.entry)
    }

    /// Whether `path` exists (a `Stat` that finds it), as the SDK's `files.exists`; any
    /// failure other than "not found" is an error.
    pub async fn exists(&self, path: &str) -> Result<bool, Error> {
        match self.stat(path).await {
            Ok(_) => Ok(true),
            Err(error) if error.is_not_found() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Creates a directory and its parents (`filesystem.Filesystem/MakeDir`).
    pub async fn make_dir(&self, path: &str) -> Result<MakeDirOutcome, Error> {
        match self
            .rpc::<_, EntryReply>(
                Operation::MakeDir,
                "filesystem.Filesystem/MakeDir",
                &PathRequest { path },
                Idempotency::Idempotent,
            )
            .await
        {
            Ok(reply) => Ok(MakeDirOutcome::Created(reply.entry)),
            Err(error) if error.is_conflict() => Ok(MakeDirOutcome::AlreadyExists),
            Err(error) => Err(error),
        }
    }

    /// Lists a directory (`filesystem.Filesystem/ListDir`) to `depth` levels (0 means 1).
    pub async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<EntryInfo>, Error> {
        let reply: ListDirReply = self
            .rpc(
                Operation::ListDir,
                "filesystem.Filesystem/ListDir",
                &ListDirRequest { path, depth },
                Idempotency::Idempotent,
            )
            .await?;
        Ok(reply.entries)
    }

    /// Removes a file or a directory tree (`filesystem.Filesystem/Remove`); removing what is not
    /// there succeeds, as in envd.
    pub async fn remove(&self, path: &str) -> Result<(), Error> {
        self.rpc::<_, serde::de::IgnoredAny>(
            Operation::Remove,
            "filesystem.Filesystem/Remove",
            &PathRequest { path },
            Idempotency::Idempotent,
        )
        .await?;
        Ok(())
    }

    /// Moves or renames (`filesystem.Filesystem/Move`). Not retried once sent: a second move
    /// would fail on the missing source.
    pub async fn move_path(&self, source: &str, destination: &str) -> Result<EntryInfo, Error> {
        let reply: EntryReply = self
            .rpc(
                Operation::Move,
                "filesystem.Filesystem/Move",
                &MoveRequest {
                    source,
                    destination,
                },
                Idempotency::NotIdempotent,
            )
            .await?;
        Ok(reply.entry)
    }
}

#[derive(Serialize)]
struct PathRequest<'a> {
    path: &'a str,
}

#[derive(Serialize)]
struct ListDirRequest<'a> {
    path: &'a str,
    depth: u32,
}

#[derive(Serialize)]
struct MoveRequest<'a> {
    source: &'a str,
    destination: &'a str,
}

#[derive(Deserialize)]
struct EntryReply {
    entry: EntryInfo,
}

#[derive(Deserialize)]
struct ListDirReply {
    #[serde(default, deserialize_with = "json::null_default")]
    entries: Vec<EntryInfo>,
}
