//! Credential stand-ins (contract X16): what a sandbox's commands see under a credential's
//! name, random and recognisably not a key, and how this host notes them per sandbox.

use std::collections::BTreeMap;
use std::fmt;

use crate::credentials::hex;

/// Every stand-in starts with this: recognisably not a key.
pub const STAND_IN_PREFIX: &str = "e2b-stand-in-";

/// Where stand-ins' randomness comes from: injected so tests can make it predictable.
pub trait RandomSource: fmt::Debug + Send + Sync {
    /// Fills `bytes` with random bytes.
    fn fill(&self, bytes: &mut [u8]);
}

/// The operating system's randomness.
#[derive(Debug, Clone, Copy)]
pub struct SystemRandom;

impl RandomSource for SystemRandom {
    fn fill(&self, bytes: &mut [u8]) {
        rand::RngCore::fill_bytes(&mut rand::rng(), bytes);
    }
}

/// A fresh stand-in: [`STAND_IN_PREFIX`] and 32 random hex digits, nothing of any value.
pub(crate) fn new_stand_in(random: &dyn RandomSource) -> String {
    let mut bytes = [0u8; 16];
    random.fill(&mut bytes);
    format!("{STAND_IN_PREFIX}{}", hex(&bytes))
}

/// Stand-ins in a note line: `<sandbox> NAME=stand-in ...`, when the line is about
/// `sandbox_id`.
pub(crate) fn parse_stand_ins(line: &str, sandbox_id: &str) -> BTreeMap<String, String> {
    let mut words = line.split_whitespace();
    if words.next() != Some(sandbox_id) {
        return BTreeMap::new();
    }
    words
        .filter_map(|word| word.split_once('='))
        .filter(|(_, stand_in)| stand_in.starts_with(STAND_IN_PREFIX))
        .map(|(name, stand_in)| (name.to_owned(), stand_in.to_owned()))
        .collect()
}

/// The note line for `stand_ins` of `sandbox_id`.
pub(crate) fn stand_ins_line(sandbox_id: &str, stand_ins: &BTreeMap<String, String>) -> String {
    let mut line = sandbox_id.to_owned();
    for (name, stand_in) in stand_ins {
        line.push(' ');
        line.push_str(name);
        line.push('=');
        line.push_str(stand_in);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_ins_are_random_prefixed_and_round_trip_through_the_note() {
        // contract: X16
        let a = new_stand_in(&SystemRandom);
        let b = new_stand_in(&SystemRandom);
        assert!(a.starts_with(STAND_IN_PREFIX) && a.len() == STAND_IN_PREFIX.len() + 32);
        assert_ne!(a, b);
        let mut stand_ins = BTreeMap::new();
        stand_ins.insert("GITHUB_TOKEN".to_owned(), a.clone());
        let line = stand_ins_line("isbx1", &stand_ins);
        assert_eq!(parse_stand_ins(&line, "isbx1"), stand_ins);
        assert!(parse_stand_ins(&line, "isbx2").is_empty());
    }
}
