//! The store's fault knobs (the admin API's `vanish` and `pause`) and its census of the
//! processes that run, which the admin API reports and the server's shutdown ends.

use http::StatusCode;

use super::{SbState, Store};

impl Store {
    /// Fault knob: removes a sandbox as if it had been killed.
    pub(crate) fn vanish(&self, id: &str) -> Result<(), &'static str> {
        self.kill(id).map_err(|_| "does not exist")
    }

    /// Fault knob: pauses a running sandbox (keeping its memory, as E2B's pause does).
    pub(crate) fn force_pause(&self, id: &str) -> Result<(), &'static str> {
        match self.pause(id, true) {
            Ok(()) => Ok(()),
            Err(e) if e.status == StatusCode::CONFLICT => Err("is already paused"),
            Err(_) => Err("does not exist"),
        }
    }

    /// Processes running in the running sandboxes (a killed client's commands included); a
    /// paused sandbox's frozen processes run nothing until it resumes.
    pub(crate) fn running_processes(&self) -> usize {
        self.lock()
            .entries
            .values()
            .filter(|entry| entry.record.state == SbState::Running)
            .map(|entry| entry.procs.running().len())
            .sum()
    }

    /// Kills the processes of every sandbox (server shutdown); records stay as they are.
    pub(crate) fn kill_all_processes(&self) {
        for entry in self.lock().entries.values() {
            entry.procs.close_and_kill();
        }
    }
}
