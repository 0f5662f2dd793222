//! Materialising accepted members under a directory handle.

use std::io::{self, Read};

use cap_std::fs::{Dir, OpenOptions};

use capped_tar::Member;

use crate::archive::MemberSink;

/// A [`MemberSink`] that writes accepted members below one directory.
///
/// Every operation goes through the `cap_std` handle, which refuses any path (symlinks already
/// in the directory included) that would resolve outside it: a member is never materialised
/// outside the target. Files are created or truncated; modes are the process default.
#[derive(Debug)]
pub struct DirExtractor<'a> {
    target: &'a Dir,
}

impl<'a> DirExtractor<'a> {
    /// Extracts into `target`.
    pub fn new(target: &'a Dir) -> Self {
        Self { target }
    }
}

impl MemberSink for DirExtractor<'_> {
    fn directory(&mut self, member: &Member) -> io::Result<()> {
        self.target.create_dir_all(member.path.as_str())
    }

    fn file(&mut self, member: &Member, content: &mut dyn Read) -> io::Result<()> {
        if let Some((parent, _)) = member.path.as_str().rsplit_once('/') {
            self.target.create_dir_all(parent)?;
        }
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        let mut file = self.target.open_with(member.path.as_str(), &options)?;
        io::copy(content, &mut file)?;
        Ok(())
    }
}
