//! The integration tests of writer-lease, one test binary (tests/multiprocess.rs, which spawns
//! processes, is kept apart: see its top).

mod arbitration;
mod model;
mod protocol;
mod support;
