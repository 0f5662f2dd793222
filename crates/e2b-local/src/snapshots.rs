//! Snapshots: a sandbox's files kept as a template that new sandboxes start from.
//!
//! Laid out under `<state_dir>/snapshots/` as E2B models them: a snapshot template
//! (`<template id>/template.json`: id, optional alias, the built-in template the files
//! started from) with one build per tag (`<template id>/builds/<build id>/{home,tmp}`).
//! A second snapshot under an existing name and tag gets a new build under the same
//! template (E2B: "a new build is assigned to the existing template"); the old build goes.
//! Copies are made in `.staging/` and renamed into place, so a crash never leaves a
//! half-copied build behind a name.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use http::StatusCode;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::clock::{Clock, nanos};
use crate::reply::ApiError;
use crate::store::{Cursor, SnapshotOrigin, SnapshotSource};
use crate::tree_copy::{CopyStats, copy_tree};

/// The team slug e2b-local answers as: the namespace of every snapshot name.
pub(crate) const TEAM_SLUG: &str = "local";

/// The tag a name without one means.
const DEFAULT_TAG: &str = "default";

const TEMPLATE_FILE: &str = "template.json";
const STAGING: &str = ".staging";

/// What made a template: a sandbox's snapshot, or a build of steps ([`crate::builder`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    #[default]
    Snapshot,
    Built,
}

/// One snapshot template as persisted.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Template {
    template_id: String,
    #[serde(default)]
    kind: Kind,
    /// The alias (without namespace or tag), when named.
    alias: Option<String>,
    /// The built-in template the files started from (decides the user's home).
    base_template: String,
    /// Tag → the build it points at.
    tags: BTreeMap<String, Build>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Build {
    build_id: String,
    /// The sandbox it was taken of.
    source_sandbox: String,
    /// Unix nanoseconds.
    created_at: u64,
    /// Creation order, the tie-breaker of list ordering.
    seq: u64,
    /// A built template's user, working directory, variables and start command.
    #[serde(default)]
    config: Option<crate::builds::BuildConfig>,
}

impl Template {
    /// `namespace/alias:tag` when named, else `<template id>:tag`.
    fn snapshot_id(&self, tag: &str) -> String {
        match &self.alias {
            Some(alias) => format!("{TEAM_SLUG}/{alias}:{tag}"),
            None => format!("{}:{tag}", self.template_id),
        }
    }

    fn info_json(&self, tag: &str) -> Value {
        let names: Vec<String> = self
            .alias
            .iter()
            .map(|alias| format!("{TEAM_SLUG}/{alias}:{tag}"))
            .collect();
        json!({"snapshotID": self.snapshot_id(tag), "names": names})
    }
}

#[derive(Debug, Default)]
struct Index {
    templates: BTreeMap<String, Template>,
    next_seq: u64,
}

impl Index {
    fn by_alias(&self, alias: &str) -> Option<&Template> {
        self.templates
            .values()
            .find(|t| t.alias.as_deref() == Some(alias))
    }

    /// The template a reference names: its id, its alias, or `namespace/alias`.
    fn lookup(&self, reference: &Reference) -> Option<&Template> {
        match &reference.namespace {
            Some(namespace) if namespace != TEAM_SLUG => None,
            Some(_) => self.by_alias(&reference.identifier),
            None => self
                .templates
                .get(&reference.identifier)
                .or_else(|| self.by_alias(&reference.identifier)),
        }
    }
}

/// A snapshot name or id as a client wrote it, split and lowercased: `[namespace/]id[:tag]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    namespace: Option<String>,
    identifier: String,
    /// `None` when no tag was written (which means `default` where one build is meant).
    tag: Option<String>,
}

impl Reference {
    /// Splits a reference without validating it (an invalid one just names nothing).
    pub(crate) fn parse(text: &str) -> Reference {
        let text = text.trim().to_lowercase();
        let (identifier, tag) = match text.split_once(':') {
            Some((identifier, tag)) => (identifier, Some(tag.trim().to_owned())),
            None => (text.as_str(), None),
        };
        let (namespace, identifier) = match identifier.split_once('/') {
            Some((namespace, rest)) => (Some(namespace.trim().to_owned()), rest),
            None => (None, identifier),
        };
        Reference {
            namespace,
            identifier: identifier.trim().to_owned(),
            tag,
        }
    }

    /// Whether it is explicitly in e2b-local's own namespace (`local/...`).
    pub(crate) fn in_team_namespace(&self) -> bool {
        self.namespace.as_deref() == Some(TEAM_SLUG)
    }

    fn tag_or_default(&self) -> &str {
        self.tag.as_deref().unwrap_or(DEFAULT_TAG)
    }
}

/// A valid snapshot name, as E2B's `id.ParseName` accepts it: trimmed and lowercased,
/// alias `^[a-z0-9-_]+$`, an optional `namespace/` that must be the team's, an optional
/// `:tag` matching `^[a-z0-9-_.]+$` (`default` when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Name {
    alias: String,
    tag: String,
}

fn is_identifier(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn is_tag(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
        })
}

/// Parses a snapshot name; the error is the 400 E2B answers, in its words.
pub(crate) fn parse_name(input: &str) -> Result<Name, ApiError> {
    let invalid = |what: &str, value: &str| {
        ApiError::bad_request(format!("Invalid name: invalid {what}: {value}"))
    };
    let input = input.trim();
    let (identifier, tag) = match input.split_once(':') {
        Some((identifier, tag)) => (identifier, Some(tag)),
        None => (input, None),
    };
    let (namespace, alias) = match identifier.split_once('/') {
        Some((namespace, alias)) => (Some(namespace), alias),
        None => (None, identifier),
    };
    let tag = match tag {
        Some(raw) => {
            let cleaned = raw.trim().to_lowercase();
            if !is_tag(&cleaned) {
                return Err(invalid("tag", raw));
            }
            cleaned
        }
        None => DEFAULT_TAG.to_owned(),
    };
    if let Some(raw) = namespace {
        let cleaned = raw.trim().to_lowercase();
        if !is_identifier(&cleaned) {
            return Err(invalid("namespace", raw));
        }
        if cleaned != TEAM_SLUG {
            return Err(ApiError::bad_request(format!(
                "namespace '{cleaned}' must match your team '{TEAM_SLUG}'"
            )));
        }
    }
    let cleaned = alias.trim().to_lowercase();
    if !is_identifier(&cleaned) {
        return Err(invalid("template ID", alias));
    }
    Ok(Name {
        alias: cleaned,
        tag,
    })
}

/// What a sandbox made from a snapshot starts with.
#[derive(Debug)]
pub(crate) struct Resolved {
    /// The snapshot's template id (reported as the sandbox's `templateID`).
    pub(crate) template_id: String,
    pub(crate) origin: SnapshotOrigin,
    /// Holds `home/` and `tmp/`.
    pub(crate) files: PathBuf,
    /// A built template's configuration (`None` for a snapshot).
    pub(crate) config: Option<crate::builds::BuildConfig>,
}

/// A snapshot list filter, already parsed.
#[derive(Debug)]
pub(crate) struct SnapshotQuery {
    pub(crate) sandbox_id: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) cursor: Option<Cursor>,
    pub(crate) limit: usize,
}

/// Files copied for a snapshot, not yet filed under a template (a fork's one-off capture
/// too); removed when dropped unless committed.
#[derive(Debug)]
pub(crate) struct Capture {
    dir: PathBuf,
    source: SnapshotSource,
    pub(crate) stats: CopyStats,
}

impl Capture {
    /// Holds `home/` and `tmp/`.
    pub(crate) fn files(&self) -> &Path {
        &self.dir
    }

    /// The captured sandbox as it was.
    pub(crate) fn source(&self) -> &SnapshotSource {
        &self.source
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        remove_dir(&self.dir);
    }
}

/// The snapshot registry.
#[derive(Debug)]
pub(crate) struct Snapshots {
    dir: PathBuf,
    clock: Clock,
    index: Mutex<Index>,
}

fn remove_dir(dir: &Path) {
    if let Err(error) = fs::remove_dir_all(dir)
        && error.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %dir.display(), %error, "removing snapshot files failed");
    }
}

fn random_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// A new template's id (E2B's are 20 characters of `[a-z0-9]`).
pub(crate) fn new_template_id() -> String {
    random_id(20)
}

fn template_not_found(reference: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("template '{reference}' not found"),
    )
}

impl Snapshots {
    /// Opens (or creates) `<state_dir>/snapshots` and loads every snapshot template; copies
    /// a crash left unfinished are removed.
    pub(crate) fn open(state_dir: &Path, clock: Clock) -> io::Result<Snapshots> {
        let dir = state_dir.join("snapshots");
        fs::create_dir_all(&dir)?;
        remove_dir(&dir.join(STAGING));
        fs::create_dir_all(dir.join(STAGING))?;
        let mut index = Index::default();
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path().join(TEMPLATE_FILE);
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            match serde_json::from_str::<Template>(&text) {
                Ok(template) => {
                    for build in template.tags.values() {
                        index.next_seq = index.next_seq.max(build.seq + 1);
                    }
                    index
                        .templates
                        .insert(template.template_id.clone(), template);
                }
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "skipping unreadable snapshot template");
                }
            }
        }
        Ok(Snapshots {
            dir,
            clock,
            index: Mutex::new(index),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn build_dir(&self, template_id: &str, build_id: &str) -> PathBuf {
        self.dir.join(template_id).join("builds").join(build_id)
    }

    /// Copies a sandbox's files (home, tmp and its root layer) into a staging directory, holding its
    /// processes still meanwhile. Errors are the caller's answer.
    pub(crate) fn capture(&self, source: SnapshotSource) -> Result<Capture, ApiError> {
        let dir = self.dir.join(STAGING).join(random_id(20));
        let mut capture = Capture {
            dir,
            source,
            stats: CopyStats::default(),
        };
        let copied = {
            let _held = capture.source.procs.hold_still();
            fs::create_dir(&capture.dir).and_then(|()| {
                let home = copy_tree(&capture.source.dir.join("home"), &capture.dir.join("home"))?;
                let tmp = copy_tree(&capture.source.dir.join("tmp"), &capture.dir.join("tmp"))?;
                let layer = crate::root_layer::copy_layer(&capture.source.dir, &capture.dir)?;
                Ok(CopyStats {
                    files: home.files + tmp.files + layer.files,
                    bytes: home.bytes + tmp.bytes + layer.bytes,
                    reflinked: home.reflinked + tmp.reflinked + layer.reflinked,
                    skipped: home.skipped + tmp.skipped + layer.skipped,
                })
            })
        };
        match copied {
            Ok(stats) => {
                capture.stats = stats;
                Ok(capture)
            }
            Err(error) => Err(ApiError::internal(format!(
                "Error creating snapshot template: {error}"
            ))),
        }
    }

    /// Files a capture as a snapshot, under `name` when given (replacing that name's build
    /// of the same tag). Returns the `SnapshotInfo` answer.
    pub(crate) fn commit(&self, capture: Capture, name: Option<&Name>) -> Result<Value, ApiError> {
        let now = nanos(self.clock.now());
        let build_id = random_id(20);
        let tag = name.map_or(DEFAULT_TAG, |name| name.tag.as_str());
        let (answer, replaced) = {
            let mut index = self.lock();
            let existing = name
                .and_then(|name| index.by_alias(&name.alias))
                .map(|t| t.template_id.clone());
            let template_id = existing.unwrap_or_else(|| random_id(20));
            let target = self.build_dir(&template_id, &build_id);
            let moved = target
                .parent()
                .map_or(Ok(()), fs::create_dir_all)
                .and_then(|()| fs::rename(&capture.dir, &target));
            if let Err(error) = moved {
                return Err(ApiError::internal(format!(
                    "Error creating snapshot template: {error}"
                )));
            }
            let seq = index.next_seq;
            index.next_seq += 1;
            let template = index
                .templates
                .entry(template_id.clone())
                .or_insert_with(|| Template {
                    template_id: template_id.clone(),
                    kind: Kind::Snapshot,
                    alias: name.map(|name| name.alias.clone()),
                    base_template: capture.source.record.base_template().to_owned(),
                    tags: BTreeMap::new(),
                });
            let build = Build {
                build_id,
                source_sandbox: capture.source.record.id.clone(),
                created_at: now,
                seq,
                config: None,
            };
            let gone = self.retag(template, &[tag.to_owned()], &build)?;
            (template.info_json(tag), gone)
        };
        // The old build goes once the new one is filed; a sandbox being created from it
        // right now may fail, as one created from a deleted snapshot does.
        for old in replaced {
            remove_dir(&old);
        }
        Ok(answer)
    }

    /// Points `tags` at `build` (a tag already there moves) and saves the template. Returns
    /// the directories of the builds no tag is left on, to remove once the index is unlocked.
    fn retag(
        &self,
        template: &mut Template,
        tags: &[String],
        build: &Build,
    ) -> Result<Vec<PathBuf>, ApiError> {
        let replaced: Vec<String> = tags
            .iter()
            .filter_map(|tag| template.tags.insert(tag.clone(), build.clone()))
            .map(|old| old.build_id)
            .collect();
        self.persist(template)?;
        Ok(replaced
            .iter()
            .filter(|old| unreferenced(template, old))
            .map(|old| self.build_dir(&template.template_id, old))
            .collect())
    }

    /// Takes `tags` off a template (all of them there, else `missing` names the first one
    /// that is not); a template left without tags goes whole. Returns the directories to
    /// remove once the index is unlocked: the template's, or those of builds no tag is
    /// left on.
    fn untag(
        &self,
        index: &mut Index,
        template_id: &str,
        tags: &[String],
        missing: impl Fn(&str) -> ApiError,
    ) -> Result<Vec<PathBuf>, ApiError> {
        let template = index
            .templates
            .get_mut(template_id)
            .ok_or_else(|| missing(""))?;
        if let Some(absent) = tags.iter().find(|tag| !template.tags.contains_key(*tag)) {
            return Err(missing(absent));
        }
        let removed: Vec<String> = tags
            .iter()
            .filter_map(|tag| template.tags.remove(tag))
            .map(|build| build.build_id)
            .collect();
        if template.tags.is_empty() {
            index.templates.remove(template_id);
            return Ok(vec![self.dir.join(template_id)]);
        }
        self.persist(template)?;
        Ok(removed
            .iter()
            .filter(|old| unreferenced(template, old))
            .map(|old| self.build_dir(template_id, old))
            .collect())
    }

    fn persist(&self, template: &Template) -> Result<(), ApiError> {
        let path = self.dir.join(&template.template_id).join(TEMPLATE_FILE);
        let tmp = path.with_extension("json.tmp");
        serde_json::to_vec_pretty(template)
            .map_err(io::Error::other)
            .and_then(|bytes| fs::write(&tmp, bytes))
            .and_then(|()| fs::rename(&tmp, &path))
            .map_err(|error| {
                ApiError::internal(format!("Error creating snapshot template: {error}"))
            })
    }

    /// The snapshot a create request's `templateID` names, if any.
    pub(crate) fn resolve(&self, reference: &Reference) -> Option<Resolved> {
        let index = self.lock();
        let template = index.lookup(reference)?;
        let build = template.tags.get(reference.tag_or_default())?;
        Some(Resolved {
            template_id: template.template_id.clone(),
            origin: SnapshotOrigin {
                alias: template.alias.clone(),
                base_template: template.base_template.clone(),
            },
            files: self.build_dir(&template.template_id, &build.build_id),
            config: build.config.clone(),
        })
    }

    /// Deletes what `reference` names (`DELETE /templates/{id}`): one tag when a tag is
    /// written, else the whole template. 404 when it names nothing.
    pub(crate) fn delete(&self, raw: &str) -> Result<(), ApiError> {
        let reference = Reference::parse(raw);
        let gone: Vec<PathBuf> = {
            let mut index = self.lock();
            let template_id = index
                .lookup(&reference)
                .map(|t| t.template_id.clone())
                .ok_or_else(|| template_not_found(raw))?;
            match &reference.tag {
                Some(tag) => {
                    self.untag(&mut index, &template_id, std::slice::from_ref(tag), |_| {
                        template_not_found(raw)
                    })?
                }
                None => {
                    index.templates.remove(&template_id);
                    vec![self.dir.join(&template_id)]
                }
            }
        };
        for dir in gone {
            remove_dir(&dir);
        }
        Ok(())
    }

    /// One page of `GET /snapshots`, newest first: the items and the next page's token.
    pub(crate) fn list(&self, query: &SnapshotQuery) -> (Vec<Value>, Option<String>) {
        let index = self.lock();
        let by_name = query.name.as_deref().map(Reference::parse);
        let named_template = by_name
            .as_ref()
            .map(|reference| index.lookup(reference).map(|t| t.template_id.clone()));
        let mut rows: Vec<(Cursor, &Template, &str)> = index
            .templates
            .values()
            .filter(|t| t.kind == Kind::Snapshot)
            .filter(|t| match &named_template {
                None => true,
                Some(found) => found.as_deref() == Some(t.template_id.as_str()),
            })
            .flat_map(|t| t.tags.iter().map(move |(tag, build)| (t, tag, build)))
            .filter(|(_, tag, _)| {
                by_name
                    .as_ref()
                    .and_then(|r| r.tag.as_deref())
                    .is_none_or(|wanted| wanted == tag.as_str())
            })
            .filter(|(_, _, build)| {
                query
                    .sandbox_id
                    .as_deref()
                    .is_none_or(|id| build.source_sandbox == id)
            })
            .map(|(t, tag, build)| {
                let key = Cursor {
                    started_at: build.created_at,
                    seq: build.seq,
                };
                (key, t, tag.as_str())
            })
            .filter(|(key, _, _)| query.cursor.is_none_or(|cursor| *key < cursor))
            .collect();
        rows.sort_by_key(|row| std::cmp::Reverse(row.0));
        let more = rows.len() > query.limit;
        rows.truncate(query.limit);
        let next = if more {
            rows.last().map(|(key, t, _)| key.encode(&t.template_id))
        } else {
            None
        };
        let items = rows
            .iter()
            .map(|(_, template, tag)| template.info_json(tag))
            .collect();
        (items, next)
    }
}

/// Whether no tag of `template` points at `build_id` any more (its files may go).
fn unreferenced(template: &Template, build_id: &str) -> bool {
    template
        .tags
        .values()
        .all(|build| build.build_id != build_id)
}

/// Where a finished template build is filed.
#[derive(Debug)]
pub(crate) struct BuildTarget<'a> {
    pub(crate) template_id: &'a str,
    pub(crate) alias: &'a str,
    pub(crate) build_id: &'a str,
    /// Every tag that points at the build once it is filed.
    pub(crate) tags: &'a [String],
}

/// Whether a tag names a build: E2B's tag pattern, and not a UUID (build ids are).
pub(crate) fn check_tag(raw: &str) -> Result<String, ApiError> {
    let tag = raw.trim().to_lowercase();
    if !is_tag(&tag) {
        return Err(ApiError::bad_request(format!(
            "Invalid tag: invalid tag '{raw}': invalid tag: {raw}"
        )));
    }
    if crate::token::is_uuid(&tag) {
        return Err(ApiError::bad_request(format!(
            "Invalid tag: invalid tag '{raw}': tag cannot be a UUID"
        )));
    }
    Ok(tag)
}

/// Tags as E2B keeps them: each checked ([`check_tag`]), lower-cased, duplicates dropped,
/// in the order given.
pub(crate) fn check_tags<'t>(
    tags: impl IntoIterator<Item = &'t str>,
) -> Result<Vec<String>, ApiError> {
    let mut checked: Vec<String> = Vec::new();
    for tag in tags {
        let tag = check_tag(tag)?;
        if !checked.contains(&tag) {
            checked.push(tag);
        }
    }
    Ok(checked)
}

impl Name {
    /// The alias, without namespace or tag.
    pub(crate) fn alias(&self) -> &str {
        &self.alias
    }

    /// The tag written, `None` for none or `default` (E2B counts both as no tag).
    pub(crate) fn written_tag(&self) -> Option<&str> {
        (self.tag != DEFAULT_TAG).then_some(self.tag.as_str())
    }
}

impl Snapshots {
    /// The id of the template `alias` names and whether it was built (not a snapshot).
    pub(crate) fn alias_template(&self, alias: &str) -> Option<(String, bool)> {
        let index = self.lock();
        let template = index.by_alias(alias)?;
        Some((template.template_id.clone(), template.kind == Kind::Built))
    }

    /// The template id a reference names, when its alias (and the tag, if one is
    /// written) exist: `Template.exists`.
    pub(crate) fn exists(&self, reference: &Reference) -> Option<String> {
        let index = self.lock();
        let template = index.lookup(reference)?;
        match &reference.tag {
            Some(tag) if !template.tags.contains_key(tag) => None,
            _ => Some(template.template_id.clone()),
        }
    }

    /// Whether `build_id` is a filed build of `template_id`.
    pub(crate) fn has_build(&self, template_id: &str, build_id: &str) -> bool {
        self.lock()
            .templates
            .get(template_id)
            .is_some_and(|t| t.tags.values().any(|b| b.build_id == build_id))
    }

    /// Files a finished build's capture under its template and tags (a tag that pointed
    /// at an older build now points at this one; the older build's files go when no tag
    /// is left on them).
    pub(crate) fn commit_build(
        &self,
        capture: Capture,
        target: &BuildTarget<'_>,
        config: crate::builds::BuildConfig,
    ) -> Result<(), ApiError> {
        let failed = |error: io::Error| {
            ApiError::internal(format!(
                "filing build {} of template {}: {error}",
                target.build_id, target.template_id
            ))
        };
        let now = nanos(self.clock.now());
        let gone: Vec<PathBuf> = {
            let mut index = self.lock();
            let dir = self.build_dir(target.template_id, target.build_id);
            dir.parent()
                .map_or(Ok(()), fs::create_dir_all)
                .and_then(|()| fs::rename(&capture.dir, &dir))
                .map_err(failed)?;
            let seq = index.next_seq;
            index.next_seq += 1;
            let template = index
                .templates
                .entry(target.template_id.to_owned())
                .or_insert_with(|| Template {
                    template_id: target.template_id.to_owned(),
                    kind: Kind::Built,
                    alias: Some(target.alias.to_owned()),
                    base_template: capture.source.record.base_template().to_owned(),
                    tags: BTreeMap::new(),
                });
            let build = Build {
                build_id: target.build_id.to_owned(),
                source_sandbox: capture.source.record.id.clone(),
                created_at: now,
                seq,
                config: Some(config),
            };
            self.retag(template, target.tags, &build)?
        };
        for dir in gone {
            remove_dir(&dir);
        }
        Ok(())
    }

    /// Points more tags at the build `target` (`name[:tag]`) names: `POST /templates/tags`.
    /// Returns the build's id.
    pub(crate) fn assign_tags(&self, target: &str, tags: &[String]) -> Result<String, ApiError> {
        let name = parse_name(target)?;
        let mut index = self.lock();
        let template_id = index
            .by_alias(&name.alias)
            .map(|t| t.template_id.clone())
            .ok_or_else(|| tag_not_found(target, &name.tag))?;
        let template = index
            .templates
            .get_mut(&template_id)
            .ok_or_else(|| tag_not_found(target, &name.tag))?;
        let build = template
            .tags
            .get(&name.tag)
            .cloned()
            .ok_or_else(|| tag_not_found(target, &name.tag))?;
        let gone = self.retag(template, tags, &build)?;
        drop(index);
        for dir in gone {
            remove_dir(&dir);
        }
        Ok(build.build_id)
    }

    /// Removes tags from the template `name` names: `DELETE /templates/tags`. A template
    /// left without tags goes, as a delete of its last tag does.
    pub(crate) fn remove_tags(&self, name: &str, tags: &[String]) -> Result<(), ApiError> {
        if name.contains(':') {
            return Err(ApiError::bad_request(
                "Template name should not contain a tag, use the 'tags' field instead",
            ));
        }
        let parsed = parse_name(name)?;
        let gone: Vec<PathBuf> = {
            let mut index = self.lock();
            let template_id = index
                .by_alias(&parsed.alias)
                .map(|t| t.template_id.clone())
                .ok_or_else(|| template_not_found(name))?;
            self.untag(&mut index, &template_id, tags, |missing| {
                tag_not_found(name, missing)
            })?
        };
        for dir in gone {
            remove_dir(&dir);
        }
        Ok(())
    }

    /// The tags of the template an id or name names (any `:tag` ignored), oldest build
    /// first: `GET /templates/{id}/tags`.
    pub(crate) fn tags(&self, raw: &str) -> Result<Vec<Value>, ApiError> {
        let mut reference = Reference::parse(raw);
        reference.tag = None;
        let index = self.lock();
        let template = index
            .lookup(&reference)
            .ok_or_else(|| template_not_found(raw))?;
        let mut rows: Vec<(&String, &Build)> = template.tags.iter().collect();
        rows.sort_by_key(|(tag, build)| (build.seq, tag.as_str()));
        Ok(rows
            .into_iter()
            .map(|(tag, build)| {
                json!({
                    "tag": tag,
                    "buildID": build.build_id,
                    "createdAt": crate::clock::rfc3339(build.created_at),
                })
            })
            .collect())
    }
}

fn tag_not_found(name: &str, tag: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Template '{name}' with tag '{tag}' not found"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_e2bs_rules() {
        let name = parse_name("  My-Snap_1 ").unwrap();
        assert_eq!(
            (name.alias.as_str(), name.tag.as_str()),
            ("my-snap_1", "default")
        );
        let name = parse_name("local/snap:V1.2").unwrap();
        assert_eq!((name.alias.as_str(), name.tag.as_str()), ("snap", "v1.2"));
        assert_eq!(parse_name("snap:default").unwrap().tag, "default");
        let message = |text: &str| parse_name(text).unwrap_err().message;
        assert_eq!(
            message("bad name"),
            "Invalid name: invalid template ID: bad name"
        );
        assert_eq!(message("snap:v/1"), "Invalid name: invalid tag: v/1");
        assert_eq!(message("a b/snap"), "Invalid name: invalid namespace: a b");
        assert_eq!(
            message("other/snap"),
            "namespace 'other' must match your team 'local'"
        );
        assert_eq!(message(""), "Invalid name: invalid template ID: ");
    }

    #[test]
    fn references_split_namespace_identifier_and_tag() {
        let r = Reference::parse("Local/Snap:V1");
        assert!(r.in_team_namespace());
        assert_eq!(
            (r.identifier.as_str(), r.tag.as_deref()),
            ("snap", Some("v1"))
        );
        let r = Reference::parse("abc123");
        assert_eq!(
            (r.identifier.as_str(), r.tag_or_default()),
            ("abc123", "default")
        );
    }
}
