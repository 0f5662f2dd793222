//! The child's archive on the host: cut down to the plan's paths (the conflicting ones under
//! their names beside the parent's) before it is unpacked in the parent's sandbox, and the
//! content digests of the files both sides changed.

use std::collections::BTreeMap;

/// The child's `archive` (a tar it packed from `/`) cut down to what the parent takes:
/// the regular files and symbolic links at the `write` paths under their own names, those at
/// `beside`'s keys under its values; nothing else (another entry, another type, a path the
/// plan does not name is left out). `None` when nothing is taken. Every planned path must be
/// in the archive, and none may lie under a link the plan writes (extraction would follow
/// it).
pub(super) fn repack(
    archive: &[u8],
    write: &[String],
    beside: &BTreeMap<&str, String>,
) -> Result<Option<Vec<u8>>, String> {
    let mut wanted: BTreeMap<&str, &str> = write.iter().map(|p| (p.as_str(), p.as_str())).collect();
    wanted.extend(
        beside
            .iter()
            .map(|(from, to)| (*from, to.trim_start_matches('/'))),
    );
    if wanted.is_empty() {
        return Ok(None);
    }
    let mut found = std::collections::BTreeSet::new();
    let mut links = Vec::new();
    let mut out = tar::Builder::new(Vec::new());
    out.mode(tar::HeaderMode::Complete);
    for_each_entry(archive, |path, entry| {
        let Some(to) = wanted.get(path).copied() else {
            return Ok(());
        };
        if !found.insert(path.to_owned()) {
            return Err(format!("{path:?} is in the archive twice"));
        }
        let mut header = entry.header().clone();
        match header.entry_type() {
            tar::EntryType::Regular => out
                .append_data(&mut header, to, entry)
                .map_err(|error| format!("{path:?} cannot be repacked: {error}")),
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|error| format!("{path:?}: its link target cannot be read: {error}"))?
                    .ok_or_else(|| format!("{path:?}: a link without a target"))?
                    .into_owned();
                links.push(to.to_owned());
                out.append_link(&mut header, to, &target)
                    .map_err(|error| format!("{path:?} cannot be repacked: {error}"))
            }
            other => Err(format!(
                "{path:?} is a {other:?} in the archive, not a file"
            )),
        }
    })?;
    if let Some(missing) = wanted.keys().find(|path| !found.contains(**path)) {
        return Err(format!("{missing:?} is planned but not in the archive"));
    }
    for link in &links {
        let under = format!("{link}/");
        if let Some(inside) = wanted.values().find(|path| path.starts_with(&under)) {
            return Err(format!(
                "{inside:?} lies under the link {link:?} the archive also holds"
            ));
        }
    }
    out.into_inner()
        .map(Some)
        .map_err(|error| format!("the archive cannot be repacked: {error}"))
}

/// The content digests of the regular files among `paths` in `archive` (a tar the child
/// packed): a path missing from it, or not a regular file there, has none.
pub(super) fn archive_digests(
    archive: &[u8],
    paths: &[String],
) -> Result<BTreeMap<String, String>, String> {
    use sha2::Digest;
    use std::io::Read;

    let wanted: std::collections::BTreeSet<&str> = paths.iter().map(String::as_str).collect();
    let mut digests = BTreeMap::new();
    if archive.is_empty() {
        return Ok(digests);
    }
    for_each_entry(archive, |path, entry| {
        if entry.header().entry_type() != tar::EntryType::Regular || !wanted.contains(path) {
            return Ok(());
        }
        let mut hasher = sha2::Sha256::new();
        let mut buffer = [0u8; 64 * 1024];
        loop {
            let read = entry
                .read(&mut buffer)
                .map_err(|error| format!("{path}: cannot be read from the archive: {error}"))?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
        }
        digests.insert(path.to_owned(), hex::encode(hasher.finalize()));
        Ok(())
    })?;
    Ok(digests)
}

/// Calls `visit` with each entry of `archive` and its path, in order; the first error ends
/// the walk.
fn for_each_entry(
    archive: &[u8],
    mut visit: impl FnMut(&str, &mut tar::Entry<'_, &[u8]>) -> Result<(), String>,
) -> Result<(), String> {
    let mut tar = tar::Archive::new(archive);
    let entries = tar
        .entries()
        .map_err(|error| format!("the archive cannot be read: {error}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|error| format!("the archive cannot be read: {error}"))?;
        let path = entry
            .path()
            .map_err(|error| format!("an archive path cannot be read: {error}"))?
            .to_string_lossy()
            .into_owned();
        visit(&path, &mut entry)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, link, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_mode(0o644);
            match link {
                Some(target) => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_size(0);
                    builder.append_link(&mut header, path, target).unwrap();
                }
                None => {
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, path, *data).unwrap();
                }
            }
        }
        builder.into_inner().unwrap()
    }

    fn listing(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut tar = tar::Archive::new(archive);
        tar.entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let path = entry.path().unwrap().to_string_lossy().into_owned();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
                if let Some(target) = entry.link_name().unwrap() {
                    data = format!("-> {}", target.display()).into_bytes();
                }
                (path, data)
            })
            .collect()
    }

    #[test]
    fn the_repacked_archive_holds_the_planned_files_and_the_conflicts_under_their_beside_names() {
        let child = archive(&[
            ("home/user/a.txt", None, b"a"),
            ("home/user/shared.txt", None, b"child's"),
            ("home/user/not-planned.txt", None, b"x"),
            ("home/user/link", Some("a.txt"), b""),
        ]);
        let write = vec!["home/user/a.txt".to_owned(), "home/user/link".to_owned()];
        let beside = BTreeMap::from([(
            "home/user/shared.txt",
            "/home/user/shared.txt.from-child".to_owned(),
        )]);
        let repacked = repack(&child, &write, &beside).unwrap().unwrap();
        assert_eq!(
            listing(&repacked),
            vec![
                ("home/user/a.txt".to_owned(), b"a".to_vec()),
                (
                    "home/user/shared.txt.from-child".to_owned(),
                    b"child's".to_vec()
                ),
                ("home/user/link".to_owned(), b"-> a.txt".to_vec()),
            ]
        );
        assert_eq!(repack(&child, &[], &BTreeMap::new()).unwrap(), None);
    }

    #[test]
    fn a_repack_refuses_what_extraction_could_misplace() {
        let child = archive(&[("home/user/a.txt", None, b"a")]);
        let missing = repack(&child, &["home/user/b.txt".to_owned()], &BTreeMap::new());
        assert!(missing.unwrap_err().contains("not in the archive"));

        let twice = archive(&[
            ("home/user/a.txt", None, b"a"),
            ("home/user/a.txt", None, b"b"),
        ]);
        let twice = repack(&twice, &["home/user/a.txt".to_owned()], &BTreeMap::new());
        assert!(twice.unwrap_err().contains("twice"));

        // A link the plan writes, and a file planned under it: unpacking would write
        // through the link, wherever it points.
        let through = archive(&[
            ("home/user/dir", Some("/etc"), b""),
            ("home/user/dir/passwd", None, b"x"),
        ]);
        let write = vec![
            "home/user/dir".to_owned(),
            "home/user/dir/passwd".to_owned(),
        ];
        let through = repack(&through, &write, &BTreeMap::new());
        assert!(through.unwrap_err().contains("under the link"));

        assert!(
            repack(
                b"not a tar at all, but long enough to be read as a header",
                &["a".to_owned()],
                &BTreeMap::new()
            )
            .is_err()
        );
    }
}
