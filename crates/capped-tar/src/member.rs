//! What a member is: its checked name, its kind, and why a member may be rejected.

use std::fmt;

/// A checked archive member name: relative, UTF-8, no NUL, no `.`/`..`/empty components.
///
/// A leading `./` and a trailing `/` are removed; components are joined with `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberPath(String);

impl MemberPath {
    /// Checks a raw member name. `Ok(None)` is the archive root itself (`.` or `./`), which
    /// carries nothing to materialise.
    pub fn parse(raw: &[u8]) -> Result<Option<Self>, RejectReason> {
        if raw.contains(&0) {
            return Err(RejectReason::NulByte);
        }
        let text = std::str::from_utf8(raw).map_err(|_| RejectReason::NotUtf8)?;
        if text.is_empty() {
            return Err(RejectReason::EmptyName);
        }
        if text.starts_with('/') {
            return Err(RejectReason::AbsolutePath);
        }
        let mut parts: Vec<&str> = Vec::new();
        for component in text.split('/') {
            match component {
                "" | "." => {}
                ".." => return Err(RejectReason::ParentTraversal),
                other => parts.push(other),
            }
        }
        if parts.is_empty() {
            // Only `.` components: the root entry `tar -C dir -cf - .` writes first.
            return if text.chars().all(|c| c == '.' || c == '/') && text.contains('.') {
                Ok(None)
            } else {
                Err(RejectReason::EmptyName)
            };
        }
        Ok(Some(Self(parts.join("/"))))
    }

    /// The normalised name, e.g. `skills/x/SKILL.md`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `/`-separated components.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The proper ancestors, shortest first (`a`, `a/b` for `a/b/c`).
    pub fn ancestors(&self) -> impl Iterator<Item = &str> {
        self.0.match_indices('/').map(|(at, _)| &self.0[..at])
    }
}

/// What an accepted member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberKind {
    /// A regular file of `size` bytes.
    File {
        /// Content length in bytes, from the header.
        size: u64,
        /// Whether any execute bit was set (all other mode bits are dropped).
        executable: bool,
    },
    /// A directory.
    Directory,
}

/// An accepted member, as handed to the visitor of a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The checked, normalised name.
    pub path: MemberPath,
    /// The name as it appeared in the archive, lossily rendered as UTF-8 (errors name it).
    pub name: String,
    /// File or directory.
    pub kind: MemberKind,
    /// Modification time in seconds since the epoch (0 if the header's field is unreadable).
    pub mtime: u64,
}

impl fmt::Display for MemberPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a member was not accepted. Every rejection is named, never silent (contract X5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// The name is empty.
    EmptyName,
    /// The name starts with `/`.
    AbsolutePath,
    /// The name has a `..` component.
    ParentTraversal,
    /// The name contains a NUL byte.
    NulByte,
    /// The name is not UTF-8.
    NotUtf8,
    /// The name (a GNU long name or PAX path) is longer than the reader accepts.
    NameTooLong,
    /// The member's PAX extended header is larger than the reader accepts.
    ExtensionTooLarge,
    /// A regular-file member whose name ends in `/`.
    FileNameEndsWithSlash,
    /// A symbolic link.
    Symlink,
    /// A hard link.
    HardLink,
    /// A character device.
    CharacterDevice,
    /// A block device.
    BlockDevice,
    /// A named pipe.
    Fifo,
    /// A GNU sparse file.
    Sparse,
    /// Any other member type (the tar type byte).
    UnsupportedType(u8),
    /// A second member with a name already seen.
    Duplicate,
    /// An ancestor of the member is a file member seen earlier.
    ParentIsFile,
    /// A file member whose name earlier members used as a directory.
    PathIsDirectory,
}

impl RejectReason {
    /// True for the reasons that concern the member's name rather than its type or position.
    pub fn is_unsafe_name(self) -> bool {
        matches!(
            self,
            Self::EmptyName
                | Self::AbsolutePath
                | Self::ParentTraversal
                | Self::NulByte
                | Self::NotUtf8
                | Self::NameTooLong
                | Self::FileNameEndsWithSlash
        )
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyName => f.write_str("empty name"),
            Self::AbsolutePath => f.write_str("absolute path"),
            Self::ParentTraversal => f.write_str("`..` component"),
            Self::NulByte => f.write_str("NUL byte in name"),
            Self::NotUtf8 => f.write_str("name is not UTF-8"),
            Self::NameTooLong => f.write_str("name too long"),
            Self::ExtensionTooLarge => f.write_str("extended header too large"),
            Self::FileNameEndsWithSlash => f.write_str("file name ends with `/`"),
            Self::Symlink => f.write_str("symbolic link"),
            Self::HardLink => f.write_str("hard link"),
            Self::CharacterDevice => f.write_str("character device"),
            Self::BlockDevice => f.write_str("block device"),
            Self::Fifo => f.write_str("fifo"),
            Self::Sparse => f.write_str("sparse file"),
            Self::UnsupportedType(byte) => {
                write!(f, "unsupported member type {:?}", char::from(*byte))
            }
            Self::Duplicate => f.write_str("duplicate member"),
            Self::ParentIsFile => f.write_str("a parent is a file member"),
            Self::PathIsDirectory => f.write_str("earlier members use this path as a directory"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalised() {
        let parse =
            |raw: &str| MemberPath::parse(raw.as_bytes()).map(|p| p.map(|p| p.as_str().to_owned()));
        assert_eq!(parse("./skills/x/"), Ok(Some("skills/x".into())));
        assert_eq!(parse("skills//x/./y"), Ok(Some("skills/x/y".into())));
        assert_eq!(parse("./"), Ok(None));
        assert_eq!(parse("."), Ok(None));
        assert_eq!(parse(""), Err(RejectReason::EmptyName));
        assert_eq!(parse("/etc/passwd"), Err(RejectReason::AbsolutePath));
        assert_eq!(parse("a/../../b"), Err(RejectReason::ParentTraversal));
        assert_eq!(parse(".."), Err(RejectReason::ParentTraversal));
        assert_eq!(MemberPath::parse(b"a\0b"), Err(RejectReason::NulByte));
        assert_eq!(MemberPath::parse(b"a\xffb"), Err(RejectReason::NotUtf8));
    }

    #[test]
    fn ancestors_are_listed_shortest_first() {
        let path = MemberPath::parse(b"a/b/c")
            .expect("valid")
            .expect("not root");
        assert_eq!(path.ancestors().collect::<Vec<_>>(), ["a", "a/b"]);
        assert_eq!(path.components().collect::<Vec<_>>(), ["a", "b", "c"]);
    }
}
