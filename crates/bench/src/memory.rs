//! Host memory as the kernel sees it: VmRSS and VmHWM from `/proc/self/status`; and the
//! CPU time the process spent, from `getrusage`.

use serde_json::{Map, Value};

/// The resident set when the measured part began, after the peak mark was reset.
#[derive(Debug)]
pub(crate) struct Mark {
    rss_kib: Option<u64>,
    reset: bool,
}

impl Mark {
    /// Resets VmHWM to the current RSS (writing 5 to `clear_refs`, Linux 4.0+) and notes it.
    pub(crate) fn now() -> Mark {
        // Without the reset the peak may be setup's; the report says so through `hwm_reset`.
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        Mark {
            rss_kib: status_kib("VmRSS"),
            reset,
        }
    }

    /// Adds `rss_start_kib`, `hwm_kib`, `rss_growth_kib` and `hwm_reset` to `figures`.
    pub(crate) fn finish(&self, figures: &mut Map<String, Value>) {
        let hwm = status_kib("VmHWM");
        figures.insert("rss_start_kib".into(), self.rss_kib.into());
        figures.insert("hwm_kib".into(), hwm.into());
        if let (Some(hwm), Some(start)) = (hwm, self.rss_kib) {
            figures.insert("rss_growth_kib".into(), hwm.saturating_sub(start).into());
        }
        figures.insert("hwm_reset".into(), self.reset.into());
    }
}

/// One `kB` field of `/proc/self/status`.
pub(crate) fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// The CPU time this process has spent so far, user and system, every thread included
/// (those that ended too), in seconds, to the microsecond.
pub(crate) fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` only writes the struct it is given, which is plain data.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The CPU time the calling thread has spent so far, user and system, in seconds: what a
/// measurement's own helper thread (a sampler) costs, to be taken out of the process's.
pub(crate) fn thread_cpu_seconds() -> f64 {
    // SAFETY: `clock_gettime` only writes the struct it is given, which is plain data.
    let now = unsafe {
        let mut now: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now);
        now
    };
    now.tv_sec as f64 + now.tv_nsec as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_covers_memory_touched_after_the_mark() {
        let mark = Mark::now();
        // 64 MiB touched page by page, so it is resident, not only reserved.
        let block = vec![1u8; 64 << 20];
        assert_eq!(
            block
                .iter()
                .step_by(4096)
                .map(|b| u64::from(*b))
                .sum::<u64>(),
            16384
        );
        let mut figures = Map::new();
        mark.finish(&mut figures);
        let growth = figures["rss_growth_kib"]
            .as_u64()
            .expect("Linux reports VmHWM");
        assert!(growth >= 60 << 10, "grew by {growth} KiB only");
        drop(block);
    }
}
