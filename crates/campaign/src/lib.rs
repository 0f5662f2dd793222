//! The crash/fault campaign's bookkeeping: which file versions the user wrote and which
//! may legitimately be gone, and the push log that shows whether two writers ever
//! overlapped. The engine is the `campaign` binary (`src/main.rs` and its modules); the host
//! process it drives is `campaign-host`. These checks are pure, so they are unit-tested here.

use std::collections::{BTreeMap, BTreeSet};

mod ledger;

pub use ledger::{EDIT_KINDS, EditKind, Ledger, Side};

/// Pushes that overlapped in one cycle's push log: lines `B <pid>` (push began), `E <pid>`
/// (push ended) and `K <pid>` (the campaign killed the process and reaped it). A push that
/// begins while another live process is inside its own push is a second writer. A process
/// the campaign killed counts as inside its push until its `K` line only for the order of
/// lines, not in fact (it died earlier), so an overlap with it is not reported.
pub fn overlapping_pushes(log: &str) -> Vec<String> {
    let killed: BTreeSet<&str> = log
        .lines()
        .filter_map(|line| line.strip_prefix("K "))
        .collect();
    let mut open: BTreeSet<&str> = BTreeSet::new();
    let mut overlaps = Vec::new();
    for line in log.lines() {
        let Some((mark, pid)) = line.split_once(' ') else {
            overlaps.push(format!("malformed push log line {line:?}"));
            continue;
        };
        match mark {
            "B" => {
                for other in &open {
                    if *other != pid && !killed.contains(other) {
                        overlaps.push(format!(
                            "process {pid} began a push while process {other} was pushing"
                        ));
                    }
                }
                open.insert(pid);
            }
            "E" | "K" => {
                open.remove(pid);
            }
            _ => overlaps.push(format!("malformed push log line {line:?}")),
        }
    }
    overlaps
}

/// What a command's output says about the state it ran with: `None` when it saw this
/// cycle's epoch (or printed nothing, because it was cut short), else why not.
pub fn stateless_command(output: &str, epoch: &str) -> Option<String> {
    if output.contains("NOSTATE") {
        return Some("a command ran in a sandbox without the pushed state".to_owned());
    }
    output
        .lines()
        .filter(|line| line.starts_with("epoch "))
        .find(|line| *line != epoch)
        .map(|seen| format!("a command saw {seen:?} where the host had pushed {epoch:?}"))
}

/// The two-host mode's "never two writers", per sandbox: the writer record's generation
/// never goes back, and no write of an older generation lands after a newer one's. The
/// campaign feeds it every reading of the record (`v1 <generation> <expires> <host> <pid>
/// <boot>`) and of the committed marker each push uploads (`pid <pid> push <n>`); a marker's
/// generation is the highest one the record showed its process holding.
#[derive(Debug, Default)]
pub struct GenerationWatch {
    record_generation: u64,
    record_holder: Option<String>,
    generation_of: BTreeMap<u32, u64>,
    landed_generation: u64,
    last_marker: Option<String>,
    /// Times the record passed to another host with a higher generation (takeovers after a
    /// lapse and hand-overs after a release alike).
    pub takeovers: u64,
    /// Landed markers whose process the record was never seen holding (the campaign reads
    /// the record between events, so a grant shorter than that gap can go unseen).
    pub unattributed: u64,
}

impl GenerationWatch {
    /// A reading of the record; the violations it shows.
    pub fn record(&mut self, line: &str) -> Vec<String> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(generation), Some(host), Some(pid)) = (
            fields.get(1).and_then(|g| g.parse::<u64>().ok()),
            fields.get(3),
            fields.get(4).and_then(|p| p.parse::<u32>().ok()),
        ) else {
            return vec![format!("malformed writer record {line:?}")];
        };
        if fields.first() != Some(&"v1") || fields.len() != 6 {
            return vec![format!("malformed writer record {line:?}")];
        }
        let mut violations = Vec::new();
        if generation < self.record_generation {
            violations.push(format!(
                "the writer record went back from generation {} to {generation}",
                self.record_generation
            ));
        } else if generation > self.record_generation {
            if self
                .record_holder
                .as_deref()
                .is_some_and(|before| before != *host)
            {
                self.takeovers += 1;
            }
            self.record_generation = generation;
            self.record_holder = Some((*host).to_owned());
        }
        let known = self.generation_of.entry(pid).or_default();
        *known = (*known).max(generation);
        violations
    }

    /// A reading of the committed marker; the violations it shows.
    pub fn marker(&mut self, text: &str) -> Vec<String> {
        if self.last_marker.as_deref() == Some(text) {
            return Vec::new();
        }
        self.last_marker = Some(text.to_owned());
        let Some(pid) = text
            .strip_prefix("pid ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            return vec![format!("malformed push marker {text:?}")];
        };
        let Some(&generation) = self.generation_of.get(&pid) else {
            self.unattributed += 1;
            return Vec::new();
        };
        if generation < self.landed_generation {
            return vec![format!(
                "a write of generation {generation} (process {pid}) landed after one of \
                 generation {}",
                self.landed_generation
            )];
        }
        self.landed_generation = generation;
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_pushes_of_live_processes_are_two_writers() {
        assert!(overlapping_pushes("B 1\nE 1\nB 2\nE 2\n").is_empty());
        let found = overlapping_pushes("B 1\nB 2\nE 2\nE 1\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("process 2 began a push while process 1"));
        // A process killed mid-push: the next writer may begin before the K line is written.
        assert!(overlapping_pushes("B 1\nB 2\nK 1\nE 2\n").is_empty());
        assert_eq!(overlapping_pushes("X 1\n").len(), 1);
    }

    #[test]
    fn commands_must_see_this_cycles_state() {
        assert_eq!(stateless_command("epoch 4\n", "epoch 4"), None);
        assert_eq!(stateless_command("", "epoch 4"), None);
        assert!(stateless_command("NOSTATE\n", "epoch 4").is_some());
        assert!(stateless_command("epoch 3\n", "epoch 4").is_some());
    }

    #[test]
    fn a_stale_generations_write_landing_late_is_a_violation() {
        let mut watch = GenerationWatch::default();
        assert!(watch.record("v1 1 100 aa 10 bb").is_empty());
        assert!(watch.marker("pid 10 push 1\n").is_empty());
        assert!(watch.record("v1 2 200 cc 20 dd").is_empty());
        assert_eq!(watch.takeovers, 1);
        assert!(watch.marker("pid 20 push 1\n").is_empty());
        // Process 10's generation 1 write landing now is a stale write.
        let found = watch.marker("pid 10 push 2\n");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("generation 1 (process 10)"), "{found:?}");
        // The record going back, a malformed line, an unknown process.
        assert_eq!(watch.record("v1 1 300 aa 10 bb").len(), 1);
        assert_eq!(watch.record("v2 3").len(), 1);
        assert!(watch.marker("pid 99 push 1\n").is_empty());
        assert_eq!(watch.unattributed, 1);
        // The same process renewing, then re-acquiring after a release: no violation.
        let mut watch = GenerationWatch::default();
        for line in [
            "v1 1 100 aa 10 bb",
            "v1 1 160 aa 10 bb",
            "v1 2 170 aa 11 bb",
        ] {
            assert!(watch.record(line).is_empty(), "{line}");
        }
        assert!(watch.marker("pid 10 push 1\n").is_empty());
        assert!(watch.marker("pid 11 push 1\n").is_empty());
        assert_eq!(watch.takeovers, 0);
    }
}
