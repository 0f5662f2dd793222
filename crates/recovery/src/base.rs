//! The push base: what this host last pushed into one sandbox, file by file (a SHA-256 of the
//! content), kept in the host's state directory so the next resume recovery can tell a
//! sandbox copy the sandbox never changed from one it wrote.
//!
//! Without it, a file the host edits after each session is a conflict at every resume (the
//! sandbox still holds the previous push), and its quarantine grows by one copy per session
//! until the `name~N` alternatives run out and recovery fails closed for good.
//!
//! The record is trusted only as far as it can be checked: a missing, unreadable, oversized,
//! corrupt or other sandbox's record is "no base", which is today's behaviour (every
//! difference is a conflict, S6). Nothing the sandbox sends is written into it: it holds
//! digests of host bytes that were uploaded.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::Error;
use crate::roots::RECOVERABLE_ROOTS;

/// A record holds at most this many bytes (about 80,000 typical entries); a push beyond it
/// leaves the remaining files without a base (they are compared as before).
pub const PUSH_BASE_MAX_BYTES: usize = 8 * 1024 * 1024;

const MAGIC: &str = "e2b-push-base 1";
/// An entry's encoded size beyond its member name: 64 hex digits, a space, a newline.
const ENTRY_OVERHEAD: usize = 66;
/// Longest member name recorded (`PATH_MAX` less the terminator).
const MAX_MEMBER: usize = 4095;

/// A content digest (SHA-256).
type ContentDigest = [u8; 32];

/// What this host last pushed into one sandbox: for each file under `skills/` and
/// `memories/` (named relative to the Hermes home, like snapshot members), the digest of the
/// bytes uploaded.
///
/// ```
/// use recovery::{PushBase, BaseSource};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("scope.push-base");
/// let mut base = PushBase::new("sbx1");
/// base.record("skills/a/SKILL.md", b"pushed");
/// base.store(&path)?;
/// let (loaded, source) = PushBase::load(&path, "sbx1");
/// assert_eq!((loaded, source), (base, BaseSource::Record));
/// // Another sandbox's record is no base at all.
/// let (other, source) = PushBase::load(&path, "sbx2");
/// assert!(other.is_empty());
/// assert_eq!(source, BaseSource::OtherSandbox);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushBase {
    sandbox_id: String,
    files: BTreeMap<String, ContentDigest>,
    /// Encoded size of the entries, kept under [`PUSH_BASE_MAX_BYTES`].
    bytes: usize,
}

/// Where a loaded [`PushBase`] came from; anything but `Record` means an empty base.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BaseSource {
    /// The record for this sandbox, verified.
    Record,
    /// No record yet.
    Missing,
    /// A record for another sandbox (the scope's sandbox was replaced).
    OtherSandbox,
    /// A record that cannot be read or does not check out; the reason says why.
    Unusable(String),
}

impl PushBase {
    /// An empty base for `sandbox_id`.
    pub fn new(sandbox_id: &str) -> PushBase {
        PushBase {
            sandbox_id: sandbox_id.to_owned(),
            files: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// The sandbox the base describes.
    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    /// How many files have a base.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether no file has a base.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Records that `content` was uploaded to `member` (e.g. `skills/a/SKILL.md`). A member
    /// outside `skills/` and `memories/`, or with a name the record cannot hold plainly
    /// (`.`, `..`, empty components, line breaks), only loses its base; so does any member
    /// once the record is full.
    pub fn record(&mut self, member: &str, content: &[u8]) {
        self.record_digest(member, Sha256::digest(content).into());
    }

    fn record_digest(&mut self, member: &str, digest: ContentDigest) {
        self.forget_exact(member);
        if recordable(member) && self.bytes + member.len() + ENTRY_OVERHEAD <= PUSH_BASE_MAX_BYTES {
            self.bytes += member.len() + ENTRY_OVERHEAD;
            self.files.insert(member.to_owned(), digest);
        }
    }

    /// Drops the base of `member` and of everything below it (a deleted file or directory,
    /// or an upload whose bytes are not known).
    pub fn forget(&mut self, member: &str) {
        self.forget_exact(member);
        let prefix = format!("{}/", member.trim_end_matches('/'));
        let below: Vec<String> = self
            .files
            .range(prefix.clone()..)
            .take_while(|(name, _)| name.starts_with(&prefix))
            .map(|(name, _)| name.clone())
            .collect();
        for name in below {
            self.forget_exact(&name);
        }
    }

    fn forget_exact(&mut self, member: &str) {
        if self.files.remove(member).is_some() {
            self.bytes -= member.len() + ENTRY_OVERHEAD;
        }
    }

    /// Whether `content` is exactly what was last pushed to `member`.
    pub(crate) fn was_pushed(&self, member: &str, content: &mut dyn Read) -> io::Result<bool> {
        let Some(expected) = self.files.get(member) else {
            return Ok(false);
        };
        let mut hasher = Sha256::new();
        io::copy(content, &mut HashWriter(&mut hasher))?;
        let actual: ContentDigest = hasher.finalize().into();
        Ok(actual == *expected)
    }

    /// Reads the record at `path` for `sandbox_id`, defensively: whatever is wrong with it
    /// gives an empty base and says why; this never fails.
    pub fn load(path: &Path, sandbox_id: &str) -> (PushBase, BaseSource) {
        let empty = || PushBase::new(sandbox_id);
        let text = match read_capped(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (empty(), BaseSource::Missing),
            Err(e) => return (empty(), BaseSource::Unusable(e.to_string())),
        };
        match parse(&text) {
            Ok(base) if base.sandbox_id == sandbox_id => (base, BaseSource::Record),
            Ok(_) => (empty(), BaseSource::OtherSandbox),
            Err(reason) => (empty(), BaseSource::Unusable(reason.to_owned())),
        }
    }

    /// Writes the record to `path` atomically: a temp file in the same directory, synced,
    /// then renamed over the old record (and the directory synced), so a crash leaves the
    /// old record or the new one, never a mix.
    pub fn store(&self, path: &Path) -> Result<(), Error> {
        let failed = |source| Error::BaseRecord {
            sandbox_id: self.sandbox_id.clone(),
            path: path.to_path_buf(),
            source,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().ok_or_else(|| {
            failed(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the record path has no file name",
            ))
        })?;
        let temp = dir.join(format!(
            ".{}.{}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        let written = write_synced(&temp, self.encode().as_bytes())
            .and_then(|()| std::fs::rename(&temp, path));
        if let Err(source) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(failed(source));
        }
        // Best effort: the rename is durable once the directory is; a host that cannot
        // sync directories still has the record, only less certainly after a power cut.
        if let Ok(dir) = std::fs::File::open(dir) {
            let _ = dir.sync_all();
        }
        Ok(())
    }

    fn encode(&self) -> String {
        let mut out = format!("{MAGIC}\nsandbox {}\n", self.sandbox_id);
        for (member, digest) in &self.files {
            out.push_str(&hex::encode(digest));
            out.push(' ');
            out.push_str(member);
            out.push('\n');
        }
        let check = hex::encode(Sha256::digest(out.as_bytes()));
        out.push_str(&format!("end {} {check}\n", self.files.len()));
        out
    }
}

/// The record file at `path`, refused when larger than any record this crate writes.
fn read_capped(path: &Path) -> io::Result<String> {
    let limit = (PUSH_BASE_MAX_BYTES + 4096) as u64;
    let mut data = Vec::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Err(io::Error::other(
            "the record is larger than any record written",
        ));
    }
    String::from_utf8(data).map_err(|_| io::Error::other("the record is not UTF-8"))
}

fn parse(text: &str) -> Result<PushBase, &'static str> {
    let body_end = text
        .trim_end_matches('\n')
        .rfind('\n')
        .map(|at| at + 1)
        .ok_or("the record has no end line")?;
    let (body, trailer) = text.split_at(body_end);
    let trailer = trailer
        .strip_suffix('\n')
        .and_then(|t| t.strip_prefix("end "))
        .ok_or("the record has no end line")?;
    let (count, check) = trailer.split_once(' ').ok_or("the end line is malformed")?;
    if hex::encode(Sha256::digest(body.as_bytes())) != check {
        return Err("the record's checksum does not match (corrupt or truncated)");
    }
    let mut lines = body.lines();
    if lines.next() != Some(MAGIC) {
        return Err("the record has an unknown format");
    }
    let sandbox_id = lines
        .next()
        .and_then(|l| l.strip_prefix("sandbox "))
        .ok_or("the record names no sandbox")?;
    let mut base = PushBase::new(sandbox_id);
    for line in lines {
        let (digest, member) = line.split_once(' ').ok_or("an entry is malformed")?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(digest, &mut bytes).map_err(|_| "an entry's digest is malformed")?;
        if !recordable(member) || base.files.contains_key(member) {
            return Err("an entry names a member the record cannot hold");
        }
        base.record_digest(member, bytes);
        if !base.files.contains_key(member) {
            return Err("the record is over its size cap");
        }
    }
    if count.parse::<usize>().ok() != Some(base.files.len()) {
        return Err("the record's entry count does not match");
    }
    Ok(base)
}

/// Whether `member` is a plain name under a recoverable root that a line can hold.
fn recordable(member: &str) -> bool {
    let mut comps = member.split('/');
    comps
        .next()
        .is_some_and(|root| RECOVERABLE_ROOTS.contains(&root))
        && member.len() <= MAX_MEMBER
        && member.contains('/')
        && !member.contains(['\n', '\r', '\0'])
        && member
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

fn write_synced(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(data)?;
    file.sync_all()
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn stored(base: &PushBase) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("k.push-base");
        base.store(&path).expect("store");
        (dir, path)
    }

    #[test]
    fn a_record_round_trips_and_names_only_its_sandbox() {
        let mut base = PushBase::new("sbx1");
        base.record("skills/a/SKILL.md", b"one");
        base.record("memories/MEMORY.md", b"two");
        let (_dir, path) = stored(&base);
        assert_eq!(PushBase::load(&path, "sbx1"), (base, BaseSource::Record));
        let (other, source) = PushBase::load(&path, "sbx2");
        assert!(other.is_empty());
        assert_eq!(other.sandbox_id(), "sbx2");
        assert_eq!(source, BaseSource::OtherSandbox);
        let (missing, source) = PushBase::load(&path.with_extension("absent"), "sbx1");
        assert!(missing.is_empty());
        assert_eq!(source, BaseSource::Missing);
    }

    #[test]
    fn every_kind_of_damage_is_no_base() {
        let mut base = PushBase::new("sbx1");
        base.record("skills/a/SKILL.md", b"one");
        base.record("skills/b/SKILL.md", b"two");
        let (_dir, path) = stored(&base);
        let good = std::fs::read(&path).expect("read");
        let flipped = {
            let mut data = good.clone();
            data[30] ^= 1;
            data
        };
        let damaged: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", good[..good.len() - 10].to_vec()),
            ("a flipped bit", flipped),
            ("empty", Vec::new()),
            ("not UTF-8", vec![0xff, 0xfe, b'\n']),
            ("garbage", b"garbage\n".to_vec()),
            ("oversized", vec![b'a'; PUSH_BASE_MAX_BYTES + 8192]),
        ];
        for (what, data) in damaged {
            std::fs::write(&path, &data).expect("write");
            let (loaded, source) = PushBase::load(&path, "sbx1");
            assert!(loaded.is_empty(), "{what}: {loaded:?}");
            let BaseSource::Unusable(reason) = source else {
                panic!("{what}: {source:?}")
            };
            // An oversized record is refused before it is read whole.
            assert_eq!(
                reason.contains("larger than"),
                what == "oversized",
                "{what}: {reason}"
            );
        }
    }

    #[test]
    fn a_record_with_a_valid_checksum_but_a_bad_entry_is_refused() {
        // Checksummed but hand-made: entries outside the roots or with traversal are refused.
        for member in ["config.yaml", "skills/../x", "skills//x", "skills"] {
            let mut body = format!("{MAGIC}\nsandbox sbx1\n{} {member}\n", "00".repeat(32));
            let check = hex::encode(Sha256::digest(body.as_bytes()));
            body.push_str(&format!("end 1 {check}\n"));
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("r");
            std::fs::write(&path, body).expect("write");
            let (loaded, source) = PushBase::load(&path, "sbx1");
            assert!(loaded.is_empty(), "{member}");
            assert!(
                matches!(&source, BaseSource::Unusable(reason) if reason.contains("cannot hold")),
                "{member}: {source:?}"
            );
        }
    }

    #[test]
    fn a_miscounted_record_is_refused() {
        let mut body = format!("{MAGIC}\nsandbox sbx1\n{} skills/x\n", "00".repeat(32));
        let check = hex::encode(Sha256::digest(body.as_bytes()));
        body.push_str(&format!("end 2 {check}\n"));
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r");
        std::fs::write(&path, body).expect("write");
        assert!(matches!(
            PushBase::load(&path, "sbx1").1,
            BaseSource::Unusable(_)
        ));
    }

    #[test]
    fn forget_drops_a_member_and_everything_below_it_only() {
        let mut base = PushBase::new("sbx1");
        for member in ["skills/a/SKILL.md", "skills/a/x/y", "skills/ab", "skills/b"] {
            base.record(member, member.as_bytes());
        }
        base.forget("skills/a");
        let left: Vec<&str> = base.files.keys().map(String::as_str).collect();
        assert_eq!(left, ["skills/ab", "skills/b"]);
        base.forget("skills/b");
        assert_eq!(base.len(), 1);
        assert_eq!(base.bytes, "skills/ab".len() + ENTRY_OVERHEAD);
    }

    #[test]
    fn unrecordable_members_lose_their_base_and_the_cap_holds() {
        let mut base = PushBase::new("sbx1");
        base.record("skills/a", b"old");
        for member in ["skills/a\nb", "cache/x", "skills", "skills/./a", ".env"] {
            base.record(member, b"x");
        }
        assert_eq!(base.len(), 1);
        // Fill the record to the byte: entries of a fixed size, then two that take the rest.
        let long = format!("skills/{}", "n".repeat(4000));
        let entry = long.len() + 5 + ENTRY_OVERHEAD;
        for count in 0..PUSH_BASE_MAX_BYTES / entry {
            if PUSH_BASE_MAX_BYTES - base.bytes < 2 * entry {
                break;
            }
            let before = base.len();
            base.record(&format!("{long}{count:05}"), b"x");
            assert_eq!(base.len(), before + 1, "entry {count} fits");
        }
        let rest = PUSH_BASE_MAX_BYTES - base.bytes - 2 * ENTRY_OVERHEAD;
        for (name, len) in [("a", rest / 2), ("b", rest - rest / 2)] {
            let member = format!("memories/{name}{}", "m".repeat(len - 10));
            assert_eq!(member.len(), len);
            base.record(&member, b"x");
        }
        assert_eq!(base.bytes, PUSH_BASE_MAX_BYTES, "filled to the byte");
        let before = base.len();
        base.record("skills/z", b"x");
        assert_eq!(base.len(), before, "a full record takes no more entries");
        // A full record still round-trips (the reader's cap admits what the writer writes).
        let (_dir, path) = stored(&base);
        assert_eq!(PushBase::load(&path, "sbx1").1, BaseSource::Record);
        // Re-recording a known member with new content replaces it in place.
        base.record("skills/a", b"new");
        assert!(base.was_pushed("skills/a", &mut &b"new"[..]).expect("hash"));
        assert!(!base.was_pushed("skills/a", &mut &b"old"[..]).expect("hash"));
    }
}
