#![doc = include_str!("../README.md")]
#![allow(missing_docs, missing_debug_implementations)]

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use proptest::prelude::*;

/// Builds tar archives byte by byte, so tests can make any member the sandbox could send.
#[derive(Default)]
pub struct TarMaker {
    out: Vec<u8>,
}

fn header(name: &[u8], type_byte: u8, size: u64, link: &[u8]) -> [u8; 512] {
    let mut header = tar::Header::new_gnu();
    let short = &name[..name.len().min(100)];
    header.as_old_mut().name[..short.len()].copy_from_slice(short);
    header.as_old_mut().linkname[..link.len().min(100)]
        .copy_from_slice(&link[..link.len().min(100)]);
    header.set_mode(if type_byte == b'5' { 0o755 } else { 0o644 });
    header.set_size(size);
    header.set_mtime(1_700_000_000);
    header.set_uid(1000);
    header.set_gid(1000);
    header.set_entry_type(tar::EntryType::new(type_byte));
    header.set_cksum();
    let mut bytes = [0u8; 512];
    bytes.copy_from_slice(header.as_bytes());
    bytes
}

impl TarMaker {
    pub fn new() -> Self {
        Self::default()
    }

    fn block(&mut self, data: &[u8]) {
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.extend(std::iter::repeat_n(0u8, pad));
    }

    /// Any member: names longer than 100 bytes get a GNU long-name record first.
    pub fn raw(&mut self, name: &[u8], type_byte: u8, data: &[u8], link: &[u8]) -> &mut Self {
        if name.len() > 100 {
            let mut long = name.to_vec();
            long.push(0);
            let h = header(b"././@LongLink", b'L', long.len() as u64, b"");
            self.out.extend_from_slice(&h);
            self.block(&long);
        }
        let h = header(name, type_byte, data.len() as u64, link);
        self.out.extend_from_slice(&h);
        self.block(data);
        self
    }

    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.raw(name.as_bytes(), b'0', data, b"")
    }

    pub fn dir(&mut self, name: &str) -> &mut Self {
        self.raw(name.as_bytes(), b'5', b"", b"")
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(name.as_bytes(), b'2', b"", target.as_bytes())
    }

    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(name.as_bytes(), b'1', b"", target.as_bytes())
    }

    /// A PAX extended header describing the next member.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut data = Vec::new();
        for (key, value) in records {
            // "<len> <key>=<value>\n" where len counts itself.
            let body_len = key.len() + value.len() + 3;
            let mut len = body_len + 1;
            while len.to_string().len() + body_len != len {
                len += 1;
            }
            data.extend_from_slice(format!("{len} {key}=").as_bytes());
            data.extend_from_slice(value);
            data.push(b'\n');
        }
        let h = header(b"PaxHeaders/x", b'x', data.len() as u64, b"");
        self.out.extend_from_slice(&h);
        self.block(&data);
        self
    }

    /// A GNU long-name record without any member after it.
    pub fn long_name_record(&mut self, name: &[u8]) -> &mut Self {
        let h = header(b"././@LongLink", b'L', name.len() as u64, b"");
        self.out.extend_from_slice(&h);
        self.block(name);
        self
    }

    /// The archive with its end-of-archive marker (two zero blocks).
    pub fn finish(&self) -> Vec<u8> {
        let mut out = self.out.clone();
        out.extend(std::iter::repeat_n(0u8, 1024));
        out
    }

    /// The members only, without the end marker.
    pub fn unterminated(&self) -> Vec<u8> {
        self.out.clone()
    }
}

/// Archives a hostile sandbox could send: up to 11 members with absolute names, `..`, `.` and
/// empty components, non-ASCII names, and files, directories, links, devices, fifos and sparse
/// members mixed.
pub fn hostile_archive() -> impl Strategy<Value = Vec<u8>> {
    let component = prop::sample::select(vec!["a", "b", "skills", "..", ".", "", "x y", "\u{e9}"]);
    let name =
        (any::<bool>(), prop::collection::vec(component, 1..5)).prop_map(|(absolute, parts)| {
            let joined = parts.join("/");
            if absolute {
                format!("/{joined}").into_bytes()
            } else {
                joined.into_bytes()
            }
        });
    let kind = prop::sample::select(vec![b'0', b'0', b'0', b'5', b'2', b'1', b'3', b'6', b'S']);
    let member = (name, kind, prop::collection::vec(any::<u8>(), 0..700));
    prop::collection::vec(member, 0..12).prop_map(|members| {
        let mut archive = TarMaker::new();
        for (name, kind, data) in &members {
            let data: &[u8] = if *kind == b'0' { data } else { b"" };
            archive.raw(name, *kind, data, b"target");
        }
        archive.finish()
    })
}

/// A reader that counts what was pulled from it.
pub struct Counting<R> {
    pub inner: R,
    pub pulled: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pulled += n as u64;
        Ok(n)
    }
}

/// An endless stream: a valid header for one file of `size` bytes, then zeros forever. Never
/// stored, so a multi-gigabyte archive costs no memory.
pub struct HugeArchive {
    header: [u8; 512],
    position: u64,
}

impl HugeArchive {
    pub fn new(name: &str, size: u64) -> Self {
        let mut header = tar::Header::new_gnu();
        header.set_path(name).expect("short name");
        header.set_size(size);
        header.set_mode(0o644);
        header.set_cksum();
        let mut bytes = [0u8; 512];
        bytes.copy_from_slice(header.as_bytes());
        Self {
            header: bytes,
            position: 0,
        }
    }
}

impl Read for HugeArchive {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.position < 512 {
            let start = self.position as usize;
            let n = buf.len().min(512 - start);
            buf[..n].copy_from_slice(&self.header[start..start + n]);
            self.position += n as u64;
            return Ok(n);
        }
        buf.fill(0);
        self.position += buf.len() as u64;
        Ok(buf.len())
    }
}

/// A stream that fails after `after` bytes.
pub struct Failing {
    pub data: Vec<u8>,
    pub after: usize,
    pub position: usize,
}

impl Read for Failing {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.position >= self.after {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "sandbox went away",
            ));
        }
        let end = self
            .after
            .min(self.data.len())
            .min(self.position + buf.len());
        let n = end - self.position;
        buf[..n].copy_from_slice(&self.data[self.position..end]);
        self.position = end;
        Ok(n)
    }
}

/// What a filesystem entry is, for walk-and-compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File(Vec<u8>),
    Dir,
    Symlink(PathBuf),
    Other,
}

/// Every entry below `root` (not following symlinks), relative to `root`.
pub fn walk(root: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk_into(root, root, &mut out);
    out
}

fn walk_into(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
    for entry in std::fs::read_dir(dir).expect("readable test dir") {
        let entry = entry.expect("entry");
        let path = entry.path();
        let rel = path.strip_prefix(root).expect("below root").to_path_buf();
        let meta = std::fs::symlink_metadata(&path).expect("metadata");
        if meta.file_type().is_symlink() {
            out.insert(rel, Node::Symlink(std::fs::read_link(&path).expect("link")));
        } else if meta.is_dir() {
            out.insert(rel, Node::Dir);
            walk_into(root, &path, out);
        } else if meta.is_file() {
            out.insert(rel, Node::File(std::fs::read(&path).expect("read")));
        } else {
            out.insert(rel, Node::Other);
        }
    }
}

/// An error and its chain of sources, joined by `": "`: what a person is shown at the boundary,
/// where each error's `Display` names only its own step.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
