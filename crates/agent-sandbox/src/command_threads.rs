//! The threads that forward commands' output: a pool of pump threads kept for reuse, and
//! the hand-off that gives a command's pump to them when its caller has not taken it up
//! itself ([`crate::command`] starts the commands and writes the pumps).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// The process's pump threads.
static PUMPS: Pumps = Pumps::new();

/// How long an idle pump thread waits for the next command before it exits.
const PUMP_IDLE_EXIT: Duration = Duration::from_secs(30);

/// A command's whole forwarding, to its end.
pub(crate) type PumpJob = Box<dyn FnOnce() + Send>;

/// A command's pump, run once by whichever comes first: a pump thread or a caller that waits.
#[derive(Default)]
pub(crate) struct PumpSlot {
    job: Mutex<Option<PumpJob>>,
    /// Given to the pump threads already (at most once).
    handed: AtomicBool,
}

impl PumpSlot {
    pub(crate) fn put(&self, job: PumpJob) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
    }

    pub(crate) fn take(&self) -> Option<PumpJob> {
        self.job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    fn is_taken(&self) -> bool {
        self.job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Gives the job to the pump threads now (a caller that waits first still takes it up
    /// itself).
    pub(crate) fn hand_over(self: Arc<Self>) -> std::io::Result<()> {
        self.handed.store(true, Ordering::Release);
        PUMPS.submit(self)
    }

    /// Has a pump thread run the job unless it has been taken up (or handed) already.
    pub(crate) fn hand_to_thread(self: &Arc<Self>) {
        if self.is_taken() || self.handed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(error) = PUMPS.submit(Arc::clone(self)) {
            // No thread could be made: the job stays for a caller that waits, and the next
            // hand-over tries again.
            self.handed.store(false, Ordering::Release);
            tracing::warn!("no output thread could be started: {error}");
        }
    }
}

/// How long a started command waits for its caller to take its pump up (by waiting) before
/// a pump thread does.
const HAND_OFF_DELAY: Duration = Duration::from_millis(20);

/// The commands started but not yet taken up, until [`HAND_OFF_DELAY`] has passed.
pub(crate) static DEFERRED: Deferred = Deferred::new();

/// One thread, made on demand, that hands a command's pump to the pump threads when its
/// caller has not taken it up in time. It looks at most once per [`HAND_OFF_DELAY`] while
/// commands come (a push wakes it only when it sleeps without a time limit), so under load
/// it costs a fraction of a wake-up per command instead of one.
pub(crate) struct Deferred {
    state: Mutex<DeferredQueue>,
    work: Condvar,
}

struct DeferredQueue {
    slots: std::collections::VecDeque<(Arc<PumpSlot>, std::time::Instant)>,
    /// Whether the thread runs, and whether it sleeps with no time limit (only then does a
    /// push wake it).
    thread: DeferThread,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum DeferThread {
    None,
    Timed,
    Untimed,
}

impl Deferred {
    const fn new() -> Deferred {
        Deferred {
            state: Mutex::new(DeferredQueue {
                slots: std::collections::VecDeque::new(),
                thread: DeferThread::None,
            }),
            work: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeferredQueue> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn push(&'static self, slot: Arc<PumpSlot>) {
        let mut queue = self.lock();
        queue
            .slots
            .push_back((slot, std::time::Instant::now() + HAND_OFF_DELAY));
        match queue.thread {
            DeferThread::Timed => {}
            DeferThread::Untimed => {
                queue.thread = DeferThread::Timed;
                drop(queue);
                self.work.notify_one();
            }
            DeferThread::None => {
                let spawned = std::thread::Builder::new()
                    .name("e2b-command-handoff".to_owned())
                    .spawn(move || self.serve());
                match spawned {
                    Ok(_) => queue.thread = DeferThread::Timed,
                    Err(error) => {
                        // Without the thread, hand the command over now.
                        let slots: Vec<_> = queue.slots.drain(..).map(|(slot, _)| slot).collect();
                        drop(queue);
                        tracing::warn!("no command hand-off thread could be started: {error}");
                        for slot in slots {
                            slot.hand_to_thread();
                        }
                    }
                }
            }
        }
    }

    fn serve(&self) {
        let mut queue = self.lock();
        loop {
            let now = std::time::Instant::now();
            let mut due = Vec::new();
            while let Some((slot, at)) = queue.slots.front() {
                if slot.is_taken() || slot.handed.load(Ordering::Acquire) {
                    queue.slots.pop_front();
                } else if *at <= now {
                    due.push(queue.slots.pop_front().map(|(slot, _)| slot));
                } else {
                    break;
                }
            }
            if !due.is_empty() {
                drop(queue);
                for slot in due.into_iter().flatten() {
                    slot.hand_to_thread();
                }
                queue = self.lock();
                continue;
            }
            // Commands are still coming (or just came): look again after the delay without
            // being woken by each push. Only a whole idle period lets the thread sleep until a
            // push wakes it, and a longer one ends it.
            let (limit, thread) = match queue.slots.front() {
                Some((_, at)) => (at.saturating_duration_since(now), DeferThread::Timed),
                None if queue.thread == DeferThread::Timed => (HAND_OFF_DELAY, DeferThread::Timed),
                None => (PUMP_IDLE_EXIT, DeferThread::Untimed),
            };
            let was_idle = queue.slots.is_empty();
            queue.thread = thread;
            let (next, waited) = self
                .work
                .wait_timeout(queue, limit)
                .unwrap_or_else(PoisonError::into_inner);
            queue = next;
            if was_idle && queue.slots.is_empty() && waited.timed_out() {
                match queue.thread {
                    // A quiet period: sleep until the next push.
                    DeferThread::Timed => queue.thread = DeferThread::Untimed,
                    // A long quiet: the thread ends; the next push makes another.
                    DeferThread::Untimed | DeferThread::None => {
                        queue.thread = DeferThread::None;
                        return;
                    }
                }
            }
        }
    }
}

/// Threads for the pumps, kept for reuse: a command in steady state hands its pump to a
/// thread that is waiting for one instead of creating a thread (and its stack) per command.
/// Each job still has a thread to itself for as long as it runs (a job is queued only when a
/// thread is idle to take it), so a blocked sink delays nothing else. An idle thread exits
/// after [`PUMP_IDLE_EXIT`].
struct Pumps {
    state: Mutex<PumpQueue>,
    work: Condvar,
}

struct PumpQueue {
    jobs: std::collections::VecDeque<Arc<PumpSlot>>,
    /// Threads waiting for a job.
    idle: usize,
}

impl Pumps {
    const fn new() -> Pumps {
        Pumps {
            state: Mutex::new(PumpQueue {
                jobs: std::collections::VecDeque::new(),
                idle: 0,
            }),
            work: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PumpQueue> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `job` on an idle thread, or on a new one when every thread is busy.
    fn submit(&'static self, job: Arc<PumpSlot>) -> std::io::Result<()> {
        let mut queue = self.lock();
        // Every queued job has an idle thread of its own coming for it.
        if queue.idle > queue.jobs.len() {
            queue.jobs.push_back(job);
            drop(queue);
            self.work.notify_one();
            return Ok(());
        }
        drop(queue);
        std::thread::Builder::new()
            .name("e2b-command".to_owned())
            .spawn(move || self.serve(job))
            .map(drop)
    }

    fn serve(&self, first: Arc<PumpSlot>) {
        let run = |slot: Arc<PumpSlot>| {
            // Empty when a waiting caller took the job up first.
            if let Some(job) = slot.take() {
                job();
            }
        };
        run(first);
        let mut queue = self.lock();
        loop {
            if let Some(slot) = queue.jobs.pop_front() {
                drop(queue);
                // Woken by the submit, this thread may have preempted the caller on its CPU
                // just before it waits: letting it run first lets it take its command up
                // itself (one hand-over less at the command's end). Only a matter of speed.
                std::thread::yield_now();
                run(slot);
                queue = self.lock();
                continue;
            }
            queue.idle += 1;
            let (next, waited) = self
                .work
                .wait_timeout_while(queue, PUMP_IDLE_EXIT, |queue| queue.jobs.is_empty())
                .unwrap_or_else(PoisonError::into_inner);
            queue = next;
            queue.idle -= 1;
            if waited.timed_out() && queue.jobs.is_empty() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;
    use std::thread::ThreadId;
    use std::time::Instant;

    use super::*;

    fn pool() -> &'static Pumps {
        Box::leak(Box::new(Pumps::new()))
    }

    fn slot(job: impl FnOnce() + Send + 'static) -> Arc<PumpSlot> {
        let slot = Arc::new(PumpSlot::default());
        slot.put(Box::new(job));
        slot
    }

    /// Waits (bounded) until `count` threads of `pumps` are idle.
    fn await_idle(pumps: &Pumps, count: usize) {
        let limit = Instant::now() + Duration::from_secs(10);
        while pumps.lock().idle != count {
            assert!(Instant::now() < limit, "{count} idle pump threads");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_command_nobody_takes_up_goes_to_a_pump_thread_after_the_delay_and_one_taken_never_does() {
        let (tx, rx) = std_mpsc::channel::<ThreadId>();
        let taken = {
            let tx = tx.clone();
            slot(move || tx.send(std::thread::current().id()).expect("sent"))
        };
        let left = slot(move || tx.send(std::thread::current().id()).expect("sent"));
        let pushed = Instant::now();
        DEFERRED.push(Arc::clone(&taken));
        DEFERRED.push(Arc::clone(&left));
        // The caller waits at once: it runs its command itself.
        taken.take().expect("not taken yet")();
        assert_eq!(rx.recv().expect("ran"), std::thread::current().id());
        // The other one's caller never comes: a pump thread forwards it, after the delay.
        let ran_on = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("handed over");
        assert_ne!(ran_on, std::thread::current().id());
        assert!(pushed.elapsed() >= HAND_OFF_DELAY);
        // Pushed before it, the taken command was looked at first and never handed over.
        assert!(left.handed.load(Ordering::Acquire));
        assert!(!taken.handed.load(Ordering::Acquire));
    }

    #[test]
    fn commands_one_after_another_reuse_one_pump_thread() {
        let pumps = pool();
        let (tx, rx) = std_mpsc::channel::<ThreadId>();
        let mut threads = Vec::new();
        for _ in 0..3 {
            let tx = tx.clone();
            pumps
                .submit(slot(move || {
                    tx.send(std::thread::current().id()).expect("sent")
                }))
                .expect("submitted");
            threads.push(rx.recv().expect("ran"));
            await_idle(pumps, 1);
        }
        assert!(threads.iter().all(|id| *id == threads[0]), "{threads:?}");
        assert_ne!(threads[0], std::thread::current().id());
    }

    #[test]
    fn a_blocked_pump_delays_no_other_command() {
        let pumps = pool();
        let (release, blocked) = std_mpsc::channel::<()>();
        let (tx, rx) = std_mpsc::channel::<&str>();
        let first = tx.clone();
        pumps
            .submit(slot(move || {
                first.send("first started").expect("sent");
                // A sink nobody drains: blocked until the test releases it.
                blocked.recv().expect("released");
                first.send("first done").expect("sent");
            }))
            .expect("submitted");
        assert_eq!(rx.recv().expect("ran"), "first started");
        pumps
            .submit(slot(move || tx.send("second done").expect("sent")))
            .expect("submitted");
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)).expect("ran"),
            "second done"
        );
        release.send(()).expect("released");
        assert_eq!(rx.recv().expect("ran"), "first done");
    }
}
