//! A COPY step's local side: which files its source names, their hash (E2B's cache key, the
//! official SDK's `calculate_files_hash`, 2.63 variant), and the gzip'd tar that carries them.
//! Everything here blocks on the filesystem: the client runs it off the async threads.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

use super::options::{CopyPlan, SymlinkMode};

/// The sources of one COPY: absolute paths, sorted as the SDK sorts them (by their text).
pub(super) fn collect(
    context: &Path,
    src: &str,
    ignore: &[String],
) -> Result<Vec<PathBuf>, String> {
    let context = absolute_context(context)?;
    let ignore = Ignore::new(&context, ignore)?;
    let context_text = context.to_str().ok_or_else(|| {
        format!(
            "the file context {} is not valid UTF-8, which a glob cannot match",
            context.display()
        )
    })?;
    let relative = src.trim_end_matches('/');
    let pattern = format!(
        "{}/{}",
        glob::Pattern::escape(context_text.trim_end_matches('/')),
        relative
    );
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        // Dot files match `*` too (the SDK globs with DOTMATCH).
        require_literal_leading_dot: false,
    };
    let matches = glob::glob_with(&pattern, options)
        .map_err(|error| format!("invalid COPY source pattern \"{src}\": {error}"))?;
    // Keyed by the path's bytes: the SDK sorts by the path's text, not by component.
    let mut found: BTreeMap<Vec<u8>, PathBuf> = BTreeMap::new();
    for entry in matches {
        let path = entry.map_err(|error| format!("cannot read {}", error))?;
        let ignored = ignore.excludes(&context, &path);
        if ignored && !ignore.reincludes {
            continue;
        }
        let is_dir = fs::metadata(&path).is_ok_and(|meta| meta.is_dir());
        if !ignored {
            found.insert(path.as_os_str().as_bytes().to_vec(), path.clone());
        }
        if is_dir {
            add_tree(&context, &ignore, &path, &mut found)?;
        }
    }
    if found.is_empty() {
        return Err(format!(
            "No files found in {}",
            context.join(relative).display()
        ));
    }
    Ok(found.into_values().collect())
}

/// Everything below `dir` that is not ignored, not descending into symbolic links to
/// directories (nor into ignored directories, unless a `!` pattern may take something back).
fn add_tree(
    context: &Path,
    ignore: &Ignore,
    dir: &Path,
    found: &mut BTreeMap<Vec<u8>, PathBuf>,
) -> Result<(), String> {
    let entries =
        fs::read_dir(dir).map_err(|error| format!("cannot list {}: {error}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|error| format!("cannot list {}: {error}", dir.display()))?;
        let path = entry.path();
        let real_dir = entry
            .file_type()
            .map_err(|error| format!("cannot stat {}: {error}", path.display()))?
            .is_dir();
        let ignored = ignore.excludes(context, &path);
        if !ignored {
            found.insert(path.as_os_str().as_bytes().to_vec(), path.clone());
        }
        if real_dir && (!ignored || ignore.reincludes) {
            add_tree(context, ignore, &path, found)?;
        }
    }
    Ok(())
}

/// Ignore patterns in `.dockerignore` syntax: the context's `.dockerignore` lines, then the
/// spec's; the last pattern matching a path or a directory above it decides, `!` taking the
/// path back.
struct Ignore {
    patterns: Vec<(bool, glob::Pattern)>,
    /// Whether any pattern is a `!` one (else an ignored directory is not even walked).
    reincludes: bool,
}

impl Ignore {
    fn new(context: &Path, explicit: &[String]) -> Result<Ignore, String> {
        let mut lines: Vec<String> = match fs::read_to_string(context.join(".dockerignore")) {
            Ok(text) => text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(str::to_owned)
                .collect(),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(error) => return Err(format!("cannot read .dockerignore: {error}")),
        };
        lines.extend(explicit.iter().map(|line| line.trim().to_owned()));
        let mut patterns = Vec::new();
        for line in lines.iter().filter(|line| !line.is_empty()) {
            let (negated, text) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line.as_str()),
            };
            let text = text.trim_start_matches('/').trim_end_matches('/');
            let text = text.strip_prefix("./").unwrap_or(text);
            if text.is_empty() {
                continue;
            }
            let pattern = glob::Pattern::new(text)
                .map_err(|error| format!("invalid ignore pattern \"{line}\": {error}"))?;
            patterns.push((negated, pattern));
        }
        let reincludes = patterns.iter().any(|(negated, _)| *negated);
        Ok(Ignore {
            patterns,
            reincludes,
        })
    }

    /// Whether `path` (absolute, inside `context`) is left out.
    fn excludes(&self, context: &Path, path: &Path) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        let Ok(relative) = normalize(path).strip_prefix(context).map(Path::to_path_buf) else {
            return false;
        };
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        let mut excluded = false;
        for (negated, pattern) in &self.patterns {
            let hit = relative
                .ancestors()
                .filter(|candidate| !candidate.as_os_str().is_empty())
                .any(|candidate| pattern.matches_path_with(candidate, options));
            if hit {
                excluded = !negated;
            }
        }
        excluded
    }
}

/// The context as an absolute path, lexically (Python's `os.path.abspath`).
fn absolute_context(context: &Path) -> Result<PathBuf, String> {
    let absolute = std::path::absolute(context).map_err(|error| {
        format!(
            "the file context {} cannot be resolved: {error}",
            context.display()
        )
    })?;
    Ok(normalize(&absolute))
}

/// `.` and `..` removed lexically (Python's `os.path.normpath`).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// `path` relative to `context` (Python's `os.path.relpath` for a path inside it).
fn relative_to(path: &Path, context: &Path) -> Result<PathBuf, String> {
    let context = absolute_context(context)?;
    let relative = normalize(path)
        .strip_prefix(&context)
        .map(Path::to_path_buf)
        .map_err(|_| format!("{} is outside the file context", path.display()))?;
    // The context itself (a `.` source) is `.`, as `relpath` names it.
    Ok(if relative.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        relative
    })
}

/// Whether a symbolic link is followed: asked for, and it leads to a file or a directory.
fn follows(symlinks: SymlinkMode, path: &Path) -> bool {
    symlinks == SymlinkMode::Resolve
        && fs::metadata(path).is_ok_and(|meta| meta.is_file() || meta.is_dir())
}

/// E2B's cache key for a COPY step (`filesHash`): SHA-256, lower-case hex, over
/// `COPY {src} {dest}` and then, for each file in order, its path relative to the context
/// and: for a link not followed, its `lstat` mode and size (decimal) and raw target; else its
/// `stat` mode, its size unless it is a directory, and a regular file's content.
pub(crate) fn copy_hash(context: &Path, plan: &CopyPlan) -> Result<String, String> {
    let mut hasher = Sha256::new();
    hasher.update(format!("COPY {} {}", plan.src, plan.dest).as_bytes());
    for path in collect(context, &plan.src, &plan.ignore)? {
        let relative = relative_to(&path, context)?;
        hasher.update(relative.as_os_str().as_bytes());
        let link = fs::symlink_metadata(&path).map_err(|error| stat_error(&path, &error))?;
        if link.file_type().is_symlink() && !follows(plan.symlinks, &path) {
            hasher.update(link.mode().to_string().as_bytes());
            hasher.update(link.size().to_string().as_bytes());
            let target = fs::read_link(&path).map_err(|error| stat_error(&path, &error))?;
            hasher.update(target.as_os_str().as_bytes());
            continue;
        }
        let meta = fs::metadata(&path).map_err(|error| stat_error(&path, &error))?;
        hasher.update(meta.mode().to_string().as_bytes());
        if !meta.is_dir() {
            hasher.update(meta.size().to_string().as_bytes());
        }
        if meta.is_file() {
            let mut file = File::open(&path).map_err(|error| read_error(&path, &error))?;
            let mut buffer = vec![0u8; 64 << 10];
            loop {
                let read = file
                    .read(&mut buffer)
                    .map_err(|error| read_error(&path, &error))?;
                if read == 0 {
                    break;
                }
                hasher.update(&buffer[..read]);
            }
        }
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn stat_error(path: &Path, error: &io::Error) -> String {
    format!("cannot stat {}: {error}", path.display())
}

fn read_error(path: &Path, error: &io::Error) -> String {
    format!("cannot read {}: {error}", path.display())
}

/// A COPY step's archive, in an unnamed temporary file (removed when dropped), read from the
/// start.
#[derive(Debug)]
pub(crate) struct CopyArchive {
    pub(crate) file: File,
    pub(crate) len: u64,
}

/// Packs a COPY step's files as a gzip'd POSIX tar (ustar headers, PAX records for names
/// ustar cannot hold) into a temporary file. Member names are relative to the context,
/// `/`-separated; each member is added alone (a directory's entries are members of their
/// own); links are kept unless [`SymlinkMode::Resolve`], which stores what they point at
/// and fails on a broken link.
pub(crate) fn write_archive(context: &Path, plan: &CopyPlan) -> Result<CopyArchive, String> {
    let temp = tempfile::tempfile()
        .map_err(|error| format!("cannot make a temporary file for the archive: {error}"))?;
    let encoder = GzEncoder::new(BufWriter::new(temp), Compression::default());
    let encoder = pack(context, plan, encoder)?;
    let write_error = |error: io::Error| format!("cannot write the archive: {error}");
    let mut file = encoder
        .finish()
        .map_err(write_error)?
        .into_inner()
        .map_err(|error| write_error(error.into_error()))?;
    file.flush().map_err(write_error)?;
    let len = file.seek(SeekFrom::End(0)).map_err(write_error)?;
    file.seek(SeekFrom::Start(0)).map_err(write_error)?;
    Ok(CopyArchive { file, len })
}

/// Writes the tar of `plan`'s files to `out` and hands `out` back.
pub(super) fn pack<W: Write>(context: &Path, plan: &CopyPlan, out: W) -> Result<W, String> {
    let mut builder = tar::Builder::new(out);
    for path in collect(context, &plan.src, &plan.ignore)? {
        let name = relative_to(&path, context)?;
        append(&mut builder, &path, &name, plan.symlinks)?;
    }
    builder
        .into_inner()
        .map_err(|error| format!("cannot write the archive: {error}"))
}

fn append<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &Path,
    name: &Path,
    symlinks: SymlinkMode,
) -> Result<(), String> {
    let link = fs::symlink_metadata(path).map_err(|error| stat_error(path, &error))?;
    let (meta, as_link) = if link.file_type().is_symlink() {
        match symlinks {
            SymlinkMode::Preserve => (link, true),
            SymlinkMode::Resolve => {
                let target = fs::metadata(path).map_err(|error| {
                    format!(
                        "cannot resolve the symbolic link {}: {error}",
                        path.display()
                    )
                })?;
                (target, false)
            }
        }
    } else {
        (link, false)
    };
    let mut header = tar::Header::new_ustar();
    let mut pax: Vec<(&str, Vec<u8>)> = Vec::new();
    let name_bytes = name.as_os_str().as_bytes();
    if header.set_path(name).is_err() || header.path_bytes().as_ref() != name_bytes {
        pax.push(("path", name_bytes.to_vec()));
        header
            .set_path(truncated(name_bytes))
            .map_err(|error| format!("cannot name {} in the archive: {error}", name.display()))?;
    }
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    let mut content: Option<File> = None;
    if as_link {
        let target = fs::read_link(path).map_err(|error| stat_error(path, &error))?;
        let target = target.into_os_string().into_vec();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        if target.len() > 100 || header.set_link_name_literal(&target).is_err() {
            header
                .set_link_name_literal(truncated(&target).as_os_str().as_bytes())
                .map_err(|error| {
                    format!("cannot link {} in the archive: {error}", name.display())
                })?;
            pax.push(("linkpath", target));
        }
    } else if meta.is_dir() {
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(meta.mode() & 0o7777);
        header.set_size(0);
    } else if meta.is_file() {
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(meta.mode() & 0o7777);
        header.set_size(meta.len());
        content = Some(File::open(path).map_err(|error| read_error(path, &error))?);
    } else {
        // A socket, a fifo or a device: nothing a template can carry.
        return Ok(());
    }
    header.set_cksum();
    let write_error = |error: io::Error| format!("cannot write the archive: {error}");
    if !pax.is_empty() {
        let mut records = Vec::new();
        for (key, value) in &pax {
            records.extend(pax_record(key, value));
        }
        let mut extended = tar::Header::new_ustar();
        extended.set_path("PaxHeaders/entry").map_err(write_error)?;
        extended.set_entry_type(tar::EntryType::XHeader);
        extended.set_mode(0o644);
        extended.set_size(records.len() as u64);
        extended.set_cksum();
        builder
            .append(&extended, records.as_slice())
            .map_err(write_error)?;
    }
    match content {
        Some(file) => {
            // Exactly the size the header says, even if the file grows meanwhile.
            let size = header.size().map_err(write_error)?;
            builder
                .append(&header, file.take(size))
                .map_err(|error| read_error(path, &error))
        }
        None => builder.append(&header, io::empty()).map_err(write_error),
    }
}

/// At most the last 100 bytes of a name, for a header whose real name is in a PAX record.
fn truncated(name: &[u8]) -> PathBuf {
    let start = name.len().saturating_sub(100);
    let tail = name[start..].strip_prefix(b"/").unwrap_or(&name[start..]);
    PathBuf::from(OsString::from_vec(tail.to_vec()))
}

/// One PAX record: `"<len> <key>=<value>\n"`, `len` counting the whole record.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3;
    let mut len = rest + rest.to_string().len();
    if len.to_string().len() + rest != len {
        len = rest + len.to_string().len();
    }
    let mut record = format!("{len} {key}=").into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    record
}
