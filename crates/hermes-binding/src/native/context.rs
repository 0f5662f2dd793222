//! The caller's Python context (`contextvars`), carried to the thread a watched call runs on.
//!
//! A watched call (O7) runs on a thread of its own, and the Python it calls back (the state
//! hooks, the key resolver) must see what the calling Hermes thread sees: Hermes scopes the
//! profile's secrets (`agent.secret_scope`) and the session with context variables, so a key
//! looked up on a bare thread would be another profile's, or none (X2).

use std::cell::{Cell, RefCell};

use pyo3::prelude::*;
use pyo3::types::PyTuple;

thread_local! {
    /// The context of the call this thread runs for, if it runs one.
    static CALLER: RefCell<Option<Py<PyAny>>> = const { RefCell::new(None) };
    /// Whether this thread is inside that context's `run` now (a context is entered once).
    static ENTERED: Cell<bool> = const { Cell::new(false) };
}

/// A copy of the calling thread's context, taken with the GIL.
#[derive(Debug)]
pub(crate) struct CallerContext(Py<PyAny>);

impl CallerContext {
    /// `contextvars.copy_context()` of the calling thread.
    pub(crate) fn capture(py: Python<'_>) -> PyResult<CallerContext> {
        let context = py.import("contextvars")?.call_method0("copy_context")?;
        Ok(CallerContext(context.unbind()))
    }

    /// Makes this the context of every Python callback on this thread until the guard drops.
    pub(crate) fn enter(self) -> Entered {
        CALLER.with(|slot| *slot.borrow_mut() = Some(self.0));
        Entered(())
    }
}

/// Keeps a [`CallerContext`] in force on this thread.
#[derive(Debug)]
pub(crate) struct Entered(());

impl Drop for Entered {
    fn drop(&mut self) {
        // Dropping the reference without the GIL is fine: pyo3 defers the decrement.
        CALLER.with(|slot| slot.borrow_mut().take());
    }
}

/// Calls `callable(*args)` in the context this thread carries (if any), else as it is.
pub(crate) fn call_in_context<'py>(
    py: Python<'py>,
    callable: &Bound<'py, PyAny>,
    args: Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    let context = CALLER.with(|slot| slot.borrow().as_ref().map(|c| c.clone_ref(py)));
    match context {
        Some(context) if !ENTERED.with(Cell::get) => {
            ENTERED.with(|entered| entered.set(true));
            let mut run_args = vec![callable.clone()];
            run_args.extend(args.iter());
            let outcome = context
                .bind(py)
                .call_method1("run", PyTuple::new(py, run_args)?);
            ENTERED.with(|entered| entered.set(false));
            outcome
        }
        // Not a watched call's thread, or already inside its context (a callback's own
        // callback): the current context is the right one.
        _ => callable.call1(args),
    }
}
