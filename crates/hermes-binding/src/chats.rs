//! What one gateway chat's sandbox may see of the profile's per-conversation files (X19).
//!
//! Hermes keeps one profile's attachments (a document a user sent lands in
//! `cache/documents/doc_<12 hex>_<name>`, an image in `cache/images/img_<12 hex>.png`), tool
//! spills and screenshots in directories shared by every chat, and pushes all of them into
//! every remote sandbox. In a gateway with many users that hands one user's attachment to
//! another user's agent. Nothing in such a file's name or place says whose it is; the chat's
//! conversation does: the gateway tells the agent where it saved an attachment, in that
//! chat's messages, and tool results name what tools wrote.
//!
//! So a chat's sandbox gets a per-conversation file only once that chat's conversation has
//! named it. The plugin hands each turn's messages (Hermes' `pre_llm_call`, which runs in the
//! chat's session before its tools) to [`note_texts`]; the push asks [`visible`]. A file is
//! named by its stem: `<letters>_<12 hex>` where its name starts so (Hermes' cache names,
//! unique per file), else its whole file name. Sessions without a gateway chat key (the CLI,
//! one user) see everything, as before.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};

/// The profile directories (relative to the Hermes home) whose files belong to one
/// conversation: Hermes' cache trees and the attachment and paste directories.
pub(crate) const PER_CONVERSATION_DIRS: [&str; 4] =
    ["cache", "images", "attachments", "composer-pastes"];

/// At most this many names are remembered per chat; past it the oldest half is forgotten
/// (a file named that long ago is already in the chat's sandbox).
const MAX_NAMES_PER_CHAT: usize = 20_000;

/// The names each chat's conversation has mentioned, by chat key.
fn registry() -> &'static Mutex<HashMap<String, Names>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Names>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

#[derive(Default)]
struct Names {
    set: HashSet<String>,
    order: Vec<String>,
}

impl Names {
    /// Whether `name` was new.
    fn insert(&mut self, name: String) -> bool {
        let new = self.set.insert(name.clone());
        if new {
            self.order.push(name);
        }
        if self.order.len() > MAX_NAMES_PER_CHAT {
            let forgotten: Vec<String> = self.order.drain(..MAX_NAMES_PER_CHAT / 2).collect();
            for name in forgotten {
                self.set.remove(&name);
            }
        }
        new
    }
}

/// Records what `texts` (a turn's messages in chat `chat`) name: every cache stem and every
/// path-like word's last component. Whether any of it was new: the chat's next push must
/// then not wait for the sync's rate limit.
pub(crate) fn note_texts<'a>(chat: &str, texts: impl IntoIterator<Item = &'a str>) -> bool {
    let mut found = Vec::new();
    for text in texts {
        stems_in(text, &mut found);
        words_in(text, &mut found);
    }
    if found.is_empty() {
        return false;
    }
    let mut registry = registry().lock().unwrap_or_else(PoisonError::into_inner);
    let names = registry.entry(chat.to_owned()).or_default();
    let mut new = false;
    for name in found {
        new |= names.insert(name);
    }
    new
}

/// Whether a gateway chat's sandbox gets the profile's skills (`skills_in_chat_sandboxes`).
/// Hermes shares skills profile-wide by design; an operator whose users must not see skills
/// another user's agent wrote keeps them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChatSkills {
    /// Pushed as to any sandbox (Hermes' design; the default).
    Pushed,
    /// Never pushed into a chat's sandbox (skills the chat's agent writes are still pulled).
    KeptOut,
}

/// The gateway chat a sandbox serves: its key and what of the profile's shared files it gets.
#[derive(Debug, Clone)]
pub(crate) struct Chat {
    /// Hermes' session key of the chat.
    pub(crate) key: String,
    /// Whether the profile's skills reach the chat's sandbox.
    pub(crate) skills: ChatSkills,
}

/// Whether the file bound for `remote` (in the sandbox whose Hermes home is `remote_home`)
/// is a skill `chat` keeps out: external skill directories land under the sandbox's
/// `skills/` too, though their host paths are outside the profile.
pub(crate) fn remote_skill_kept_out(chat: &Chat, remote_home: &str, remote: &str) -> bool {
    chat.skills == ChatSkills::KeptOut
        && remote
            .strip_prefix(remote_home.trim_end_matches('/'))
            .is_some_and(|rest| rest.starts_with("/skills/"))
}

/// Whether `host` (a file under the profile home `host_home`) may reach the sandbox of
/// `chat`: always, unless it is a per-conversation file this chat's conversation never named,
/// or a skill the operator keeps out of chat sandboxes.
pub(crate) fn visible(chat: &Chat, host_home: &Path, host: &Path) -> bool {
    let Ok(relative) = host.strip_prefix(host_home) else {
        return true;
    };
    let first = relative
        .components()
        .next()
        .and_then(|first| first.as_os_str().to_str());
    if first == Some("skills") {
        return chat.skills == ChatSkills::Pushed;
    }
    let per_conversation = first.is_some_and(|first| PER_CONVERSATION_DIRS.contains(&first));
    if !per_conversation {
        return true;
    }
    let Some(name) = host.file_name().and_then(|name| name.to_str()) else {
        return false;
    };
    let registry = registry().lock().unwrap_or_else(PoisonError::into_inner);
    registry
        .get(&chat.key)
        .is_some_and(|names| names.set.contains(stem(name)) || names.set.contains(name))
}

/// A file name's stem: `<letters>_<12 hex>` where the name starts so, else the name.
fn stem(name: &str) -> &str {
    let bytes = name.as_bytes();
    let letters = bytes.iter().take_while(|b| b.is_ascii_alphabetic()).count();
    let hex_start = letters + 1;
    let hex_end = hex_start + 12;
    let shaped = letters > 0
        && bytes.get(letters) == Some(&b'_')
        && bytes.len() >= hex_end
        && bytes[hex_start..hex_end]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    if shaped { &name[..hex_end] } else { name }
}

/// Every `<letters>_<12 hex>` in `text`.
fn stems_in(text: &str, found: &mut Vec<String>) {
    let bytes = text.as_bytes();
    for (at, byte) in bytes.iter().enumerate() {
        if *byte != b'_' || at == 0 || !bytes[at - 1].is_ascii_alphabetic() {
            continue;
        }
        let start = bytes[..at]
            .iter()
            .rposition(|b| !b.is_ascii_alphabetic())
            .map_or(0, |p| p + 1);
        // A stem is the letters, the underscore and 12 hex digits: shorter means not one.
        let stem = stem(&text[start..]);
        if stem.len() == at - start + 13 {
            found.push(stem.to_owned());
        }
    }
}

/// The last path component of every whitespace-, quote- or bracket-separated word.
fn words_in(text: &str, found: &mut Vec<String>) {
    let separators = |c: char| c.is_whitespace() || "\"'`()[]{}<>,;".contains(c);
    for word in text.split(separators) {
        let name = word
            .rsplit('/')
            .next()
            .unwrap_or(word)
            .trim_end_matches(['.', ':']);
        if name.len() >= 3 && name.contains('.') {
            found.push(name.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // contract: X19
    #[test]
    fn a_chat_sees_the_per_conversation_files_its_conversation_named_and_no_others() {
        let home = Path::new("/home/op/.hermes");
        let doc = home.join("cache/documents/doc_0123456789ab_report q3.pdf");
        let img = home.join("cache/images/img_ba9876543210.png");
        let spill = home.join("cache/spillover/tool-output-77.txt");
        let skill = home.join("skills/demo/SKILL.md");
        let noted = note_texts(
            "agent:main:telegram:dm:1",
            [
                "[The user sent a document: 'report q3.pdf'. saved at: /home/op/.hermes/cache/documents/doc_0123456789ab_report q3.pdf]",
                "(full output in /home/op/.hermes/cache/spillover/tool-output-77.txt)",
            ],
        );
        note_texts(
            "agent:main:telegram:dm:2",
            ["here is a picture: /home/op/.hermes/cache/images/img_ba9876543210.png"],
        );
        assert!(noted, "new names");
        assert!(
            !note_texts(
                "agent:main:telegram:dm:1",
                ["(full output in /home/op/.hermes/cache/spillover/tool-output-77.txt)"]
            ),
            "named before"
        );
        let one = &chat("agent:main:telegram:dm:1", ChatSkills::Pushed);
        let two = &chat("agent:main:telegram:dm:2", ChatSkills::Pushed);
        assert!(visible(one, home, &doc) && visible(one, home, &spill));
        assert!(!visible(one, home, &img), "chat 2's image");
        assert!(visible(two, home, &img));
        assert!(
            !visible(two, home, &doc) && !visible(two, home, &spill),
            "chat 1's files"
        );
        assert!(
            !visible(
                &chat("agent:main:slack:dm:3", ChatSkills::Pushed),
                home,
                &doc
            ),
            "a chat that named nothing"
        );
        // Not per-conversation: every chat sees it (skills are profile-wide by design).
        assert!(visible(two, home, &skill));
    }

    fn chat(key: &str, skills: ChatSkills) -> Chat {
        Chat {
            key: key.to_owned(),
            skills,
        }
    }

    // contract: X19
    #[test]
    fn skills_kept_out_of_chat_sandboxes_reach_none_and_nothing_else_changes() {
        let home = Path::new("/home/op/.hermes");
        let kept_out = chat("agent:main:telegram:dm:9", ChatSkills::KeptOut);
        note_texts(
            &kept_out.key,
            ["see /home/op/.hermes/cache/documents/doc_aaaaaaaaaaaa_x.pdf"],
        );
        assert!(!visible(
            &kept_out,
            home,
            &home.join("skills/demo/SKILL.md")
        ));
        assert!(!visible(
            &kept_out,
            home,
            &home.join("skills/.bundled_manifest")
        ));
        assert!(visible(
            &kept_out,
            home,
            &home.join("cache/documents/doc_aaaaaaaaaaaa_x.pdf")
        ));
        assert!(visible(&kept_out, home, &home.join("credentials/gh.json")));
        // A directory named like it deeper down is not the profile's skills.
        assert!(visible(
            &kept_out,
            home,
            &home.join("hermes-agent/skills/a.md")
        ));
        // An external skill directory is judged by where it lands.
        let remote_home = "/home/user/.hermes";
        assert!(remote_skill_kept_out(
            &kept_out,
            remote_home,
            "/home/user/.hermes/skills/ext/SKILL.md"
        ));
        assert!(!remote_skill_kept_out(
            &kept_out,
            remote_home,
            "/home/user/.hermes/skillsets/x"
        ));
        assert!(!remote_skill_kept_out(
            &kept_out,
            remote_home,
            "/home/user/.hermes/cache/documents/x"
        ));
        let pushed = chat("agent:main:telegram:dm:8", ChatSkills::Pushed);
        assert!(!remote_skill_kept_out(
            &pushed,
            remote_home,
            "/home/user/.hermes/skills/ext/SKILL.md"
        ));
    }

    #[test]
    fn stems_are_the_cache_names_unique_part() {
        assert_eq!(stem("doc_0123456789ab_report.pdf"), "doc_0123456789ab");
        assert_eq!(stem("img_0123456789ab.png"), "img_0123456789ab");
        assert_eq!(stem("notes.txt"), "notes.txt");
        assert_eq!(stem("doc_0123456789aZ_x"), "doc_0123456789aZ_x");
        let mut found = Vec::new();
        stems_in(
            "see xdoc_0123456789ab_ and img_ffffffffffff.png, not a_123",
            &mut found,
        );
        assert_eq!(found, ["xdoc_0123456789ab", "img_ffffffffffff"]);
    }
}
