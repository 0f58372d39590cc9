//! What can go wrong, and the exit status each gives (`stack` exits 1 on an error, 2 on a usage
//! error; `status` exits 3 when the stack is not ready, which is no error).
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Wrong arguments (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// A value given on the command line or in the environment that cannot be used.
    #[error("{0}")]
    Invalid(String),
    /// A file or folder could not be read or written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A server failed to start or to get ready: the message and the end of its log.
    #[error("{msg}. Last lines of {}:{tail}", log.display())]
    Server {
        msg: String,
        log: PathBuf,
        tail: String,
    },
    /// Anything else that stops the command (a download, a build, a check, a server that is
    /// not where it should be).
    #[error("{0}")]
    Failed(String),
    /// A signal (SIGINT, SIGTERM, SIGHUP) arrived while `up` started the servers: exit status
    /// 128 + the signal, as a shell gives.
    #[error("interrupted (signal {0})")]
    Interrupted(i32),
    /// Already reported on stderr (e.g. before `up` stopped what it had started).
    #[error("(reported above)")]
    Reported,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn failed(msg: impl Into<String>) -> Error {
        Error::Failed(msg.into())
    }

    /// An I/O error on `path`, saying what was being done (`"writing"`, `"reading"`...).
    pub fn io(what: &str, path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            what: format!("{what} {}", path.display()),
            source,
        }
    }

    /// A server error with the last 40 lines of `log`, each as `    | line`.
    pub fn server(msg: impl Into<String>, log: &Path) -> Error {
        Error::Server {
            msg: msg.into(),
            log: log.to_path_buf(),
            tail: crate::sys::tail_lines(log, 40, "    | "),
        }
    }

    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Interrupted(signal) => u8::try_from(128 + signal).unwrap_or(1),
            _ => 1,
        }
    }
}

/// `.io_ctx("reading", path)` on an `io::Result`.
pub trait IoContext<T> {
    fn io_ctx(self, what: &str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io_ctx(self, what: &str, path: &Path) -> Result<T> {
        self.map_err(|e| Error::io(what, path, e))
    }
}
