//! Children whose first tool calls arrive together share one checkpoint of their parent
//! (R15): each asks [`Backend::fork_child`] for its own fork when it needs one, and the asks
//! that arrive while a fork is being made are made together next, one checkpoint for all of
//! them and one create each ([`Backend::fork_children`]). No child is forked before it asks
//! (a child that never touches the sandbox costs nothing), and none waits for a sibling that
//! has not asked.

use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::super::Backend;
use super::ChildSandbox;
use crate::error::Error;
use crate::subagent::ChildId;

/// A backend's delegated-children state.
pub(in crate::backend) struct Subagents {
    /// Set on the attach-mode backend of a delegated child's fork, which this process made:
    /// such a fork is this process's own, so the fleet may pause it for the limit like a
    /// writer's, and it may be forked again for a grandchild.
    pub(in crate::backend) fork_of: OnceLock<super::fork::ForkOf>,
    /// On a parent's backend: the children waiting for their forks.
    asks: Batcher<(ChildId, String), Result<ChildSandbox, Error>>,
    /// On a child's fork: the directories its commands ran in (`Backend::worked_in`).
    pub(in crate::backend) worked_in: Mutex<std::collections::BTreeSet<String>>,
}

impl Default for Subagents {
    fn default() -> Subagents {
        Subagents {
            fork_of: OnceLock::new(),
            worked_in: Mutex::default(),
            asks: Batcher::new(|(id, _)| {
                Err(Error::InvalidConfig {
                    reason: format!(
                        "subagent {id}'s fork was not made: the thread making it stopped"
                    ),
                })
            }),
        }
    }
}

impl Backend {
    /// A fork of the scope's sandbox for child `id`, working in `dir`, made now: with the
    /// forks of the siblings that ask while another fork is being made, one checkpoint for
    /// all ([`Backend::fork_children`]; the parent's commands are waited for up to `wait`,
    /// never cut).
    pub fn fork_child(
        &self,
        id: ChildId,
        dir: &str,
        wait: Duration,
    ) -> Result<ChildSandbox, Error> {
        self.inner
            .subagents
            .asks
            .ask((id, dir.to_owned()), |batch| self.fork_batch(batch, wait))
    }

    /// One batch of asks: one [`Backend::fork_children`] per working directory (siblings
    /// share their parent's), the answers in the asks' order.
    fn fork_batch(
        &self,
        batch: &[(ChildId, String)],
        wait: Duration,
    ) -> Vec<Result<ChildSandbox, Error>> {
        let mut answers: Vec<Option<Result<ChildSandbox, Error>>> =
            batch.iter().map(|_| None).collect();
        let mut dirs: Vec<&str> = batch.iter().map(|(_, dir)| dir.as_str()).collect();
        dirs.sort_unstable();
        dirs.dedup();
        for dir in dirs {
            let picked: Vec<usize> = (0..batch.len()).filter(|&i| batch[i].1 == dir).collect();
            let ids: Vec<ChildId> = picked.iter().map(|&i| batch[i].0.clone()).collect();
            match self.fork_children(&ids, dir, wait) {
                Ok(made) => {
                    for (&i, result) in picked.iter().zip(made) {
                        answers[i] = Some(result);
                    }
                }
                Err(error) => {
                    // The first child gets the error itself; its siblings its account.
                    let text = error.to_string();
                    let mut error = Some(error);
                    for &i in &picked {
                        answers[i] = Some(Err(error.take().unwrap_or_else(|| {
                            Error::InvalidConfig {
                                reason: format!(
                                    "subagent {}'s fork was made with its siblings' and failed: {text}",
                                    batch[i].0
                                ),
                            }
                        })));
                    }
                }
            }
        }
        answers
            .into_iter()
            .zip(batch)
            .map(|(answer, (id, _))| {
                answer.unwrap_or_else(|| {
                    Err(Error::InvalidConfig {
                        reason: format!("subagent {id}'s fork was not made"),
                    })
                })
            })
            .collect()
    }
}

/// Group commit: whoever asks while no batch is being served serves the asks, batch after
/// batch, until none is left; an ask arriving meanwhile waits and joins the next batch.
pub(crate) struct Batcher<A, R> {
    queue: Mutex<Queue<A, R>>,
    /// The answer to an ask whose batch was dropped unanswered (the serving thread panicked).
    lost: fn(&A) -> R,
}

struct Queue<A, R> {
    /// Whether a thread serves batches now.
    busy: bool,
    waiting: Vec<(A, Arc<Answer<R>>)>,
}

struct Answer<R> {
    result: Mutex<Option<R>>,
    ready: Condvar,
}

impl<R> Answer<R> {
    fn give(&self, result: R) {
        *self.result.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
        self.ready.notify_all();
    }
}

/// The batch a leader serves. Dropped unanswered (`serve` panicked), it answers its asks
/// and every waiting one with `lost` and frees the batcher, so no asker waits forever.
struct Serving<'a, A, R> {
    batcher: &'a Batcher<A, R>,
    asks: Vec<A>,
    answers: Vec<Arc<Answer<R>>>,
}

impl<A, R> Drop for Serving<'_, A, R> {
    fn drop(&mut self) {
        if self.answers.is_empty() {
            return;
        }
        let lost = self.batcher.lost;
        for (ask, answer) in self.asks.iter().zip(&self.answers) {
            answer.give(lost(ask));
        }
        let mut queue = self
            .batcher
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        queue.busy = false;
        for (ask, answer) in queue.waiting.drain(..) {
            answer.give(lost(&ask));
        }
    }
}

impl<A, R> Batcher<A, R> {
    pub(crate) fn new(lost: fn(&A) -> R) -> Batcher<A, R> {
        Batcher {
            queue: Mutex::new(Queue {
                busy: false,
                waiting: Vec::new(),
            }),
            lost,
        }
    }

    /// How many asks wait for a batch now (for tests and diagnostics).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting
            .len()
    }

    /// Asks, and waits for the answer; `serve` answers one batch, in its asks' order.
    pub(crate) fn ask(&self, ask: A, mut serve: impl FnMut(&[A]) -> Vec<R>) -> R {
        let answer = Arc::new(Answer {
            result: Mutex::new(None),
            ready: Condvar::new(),
        });
        let lead = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.waiting.push((ask, Arc::clone(&answer)));
            !std::mem::replace(&mut queue.busy, true)
        };
        if lead {
            loop {
                let (asks, answers): (Vec<A>, Vec<Arc<Answer<R>>>) = {
                    let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                    if queue.waiting.is_empty() {
                        queue.busy = false;
                        break;
                    }
                    std::mem::take(&mut queue.waiting).into_iter().unzip()
                };
                let mut serving = Serving {
                    batcher: self,
                    asks,
                    answers,
                };
                let mut results = serve(&serving.asks).into_iter();
                let answers = std::mem::take(&mut serving.answers);
                for (ask, slot) in serving.asks.iter().zip(answers) {
                    slot.give(results.next().unwrap_or_else(|| (self.lost)(ask)));
                }
            }
        }
        let mut slot = answer.result.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(result) = slot.take() {
                return result;
            }
            slot = answer
                .ready
                .wait(slot)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn asks_arriving_while_a_batch_is_served_are_served_together_next() {
        // contract: R15 — siblings asking at once share one checkpoint.
        let batcher: Arc<Batcher<u32, (u32, usize)>> = Arc::new(Batcher::new(|_| (0, 0)));
        let (entered, entered_rx) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let ask = |n: u32| {
            let (batcher, entered, release_rx, batches) = (
                Arc::clone(&batcher),
                entered.clone(),
                Arc::clone(&release_rx),
                Arc::clone(&batches),
            );
            std::thread::spawn(move || {
                batcher.ask(n, |batch| {
                    batches.lock().unwrap().push(batch.to_vec());
                    entered.send(()).unwrap();
                    release_rx.lock().unwrap().recv().unwrap();
                    batch.iter().map(|&v| (v * 10, batch.len())).collect()
                })
            })
        };
        let first = ask(1);
        entered_rx.recv().unwrap();
        // The first batch is being served: these two wait, then go together.
        let second = ask(2);
        let third = ask(3);
        while batcher.waiting() < 2 {
            std::thread::yield_now();
        }
        release.send(()).unwrap();
        entered_rx.recv().unwrap();
        release.send(()).unwrap();
        assert_eq!(first.join().unwrap(), (10, 1));
        assert_eq!(second.join().unwrap(), (20, 2));
        assert_eq!(third.join().unwrap(), (30, 2));
        let mut seen = batches.lock().unwrap().clone();
        seen[1].sort_unstable();
        assert_eq!(seen, vec![vec![1], vec![2, 3]]);
    }

    #[test]
    fn a_panicking_batch_answers_its_asks_and_the_next_ask_is_served() {
        let batcher: Arc<Batcher<u32, u32>> = Arc::new(Batcher::new(|&v| v + 1000));
        let other = Arc::clone(&batcher);
        let panicked = std::thread::spawn(move || {
            other.ask(1, |_| panic!("serving failed"));
        })
        .join();
        assert!(panicked.is_err());
        // The panic left the batcher busy; a new ask must still be answered.
        assert_eq!(batcher.ask(2, |batch| batch.to_vec()), 2);
    }
}
