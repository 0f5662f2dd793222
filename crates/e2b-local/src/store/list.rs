//! The sandbox list as E2B pages it: filtered by state, metadata, start time and template,
//! ordered by start, continued by an opaque cursor.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::{Record, SbState, Store};

/// A list query, already parsed.
#[derive(Debug)]
pub(crate) struct ListQuery {
    pub(crate) metadata: Vec<(String, String)>,
    pub(crate) states: Vec<SbState>,
    pub(crate) ascending: bool,
    pub(crate) started_after: Option<u64>,
    pub(crate) template: Option<String>,
    pub(crate) cursor: Option<Cursor>,
    pub(crate) limit: usize,
}

/// A position in the list order: (startedAt, creation sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cursor {
    pub(crate) started_at: u64,
    pub(crate) seq: u64,
}

impl Cursor {
    pub(crate) fn encode(self, id: &str) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}__{}__{id}", self.started_at, self.seq))
    }

    pub(crate) fn decode(token: &str) -> Option<Cursor> {
        let raw = URL_SAFE_NO_PAD.decode(token.trim_end_matches('=')).ok()?;
        let text = String::from_utf8(raw).ok()?;
        let mut parts = text.splitn(3, "__");
        let started_at = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        parts.next()?;
        Some(Cursor { started_at, seq })
    }
}

/// One page of a list answer.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) items: Vec<Record>,
    pub(crate) next_token: Option<String>,
    pub(crate) total_running: usize,
}

impl Store {
    /// One page of the sandboxes that match `query`.
    pub(crate) fn list(&self, query: &ListQuery) -> Page {
        self.sweep();
        let inner = self.lock();
        let total_running = inner.running_count();
        let mut items: Vec<&Record> = inner
            .entries
            .values()
            .map(|e| &e.record)
            // A build's sandbox is the server's, as E2B's builders are not the team's.
            .filter(|r| r.build_of.is_none())
            .filter(|r| query.states.contains(&r.state))
            .filter(|r| {
                query
                    .metadata
                    .iter()
                    .all(|(k, v)| r.metadata.get(k).is_some_and(|have| have == v))
            })
            .filter(|r| query.started_after.is_none_or(|t| r.started_at >= t))
            .filter(|r| query.template.as_ref().is_none_or(|t| &r.template == t))
            .collect();
        let key = |r: &Record| Cursor {
            started_at: r.started_at,
            seq: r.seq,
        };
        items.sort_by_key(|r| key(r));
        if !query.ascending {
            items.reverse();
        }
        if let Some(cursor) = query.cursor {
            items.retain(|r| {
                if query.ascending {
                    key(r) > cursor
                } else {
                    key(r) < cursor
                }
            });
        }
        let more = items.len() > query.limit;
        items.truncate(query.limit);
        let next_token = if more {
            items.last().map(|r| key(r).encode(&r.id))
        } else {
            None
        };
        Page {
            items: items.into_iter().cloned().collect(),
            next_token,
            total_running,
        }
    }
}
