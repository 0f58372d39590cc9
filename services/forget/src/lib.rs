//! Forgetting a person completely (`switchboard forget`, `DELETE /api/v1/people/<id>`), as a
//! durable job:
//!
//! 1. [`erase::forget`]: one database transaction erases every row that names them (and the ids
//!    linked into them, [`scope`]), leaves tombstones, records an erasure job ([`job`]) and,
//!    before it commits, stores the job's work message on `{p}.forget`. The caller gets the job
//!    (HTTP: 202 and a status to poll).
//! 2. [`sweep`], the forget-sweep stage (its own worker, `switchboard worker forget`): once the
//!    transaction is over, it deletes the stored stream messages and dead letters that name them
//!    ([`streams`]), waits for stages still at work on what they read before, sweeps what they
//!    published late, publishes `person.forgotten` and marks the job `done` (or `failed`, with
//!    the deletes that kept failing). Its input is acked only then: a crash anywhere is a
//!    redelivery that finishes the job.
pub mod erase;
pub mod job;
mod scope;
pub mod streams;
pub mod sweep;

pub use erase::{Begun, ForgetError, forget};
pub use job::{ErasureJob, Failure, JobStatus};
pub use sweep::STAGE;
