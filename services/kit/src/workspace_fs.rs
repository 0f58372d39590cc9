//! Files in a session's workspace, opened the way untrusted input must be: the agent works in
//! that folder while its turn runs, so anything in it may have been swapped for a symbolic
//! link to a file elsewhere on the host, a FIFO, a device or a huge file.
//!
//! Every workspace read and write goes through [`WorkspaceDir`]: each component is opened
//! relative to its parent's descriptor with `O_NOFOLLOW` (a link is refused, never followed),
//! a file is read only if `fstat` says it is a regular file with one link and at most the
//! caller's cap (opened `O_NONBLOCK`, so a FIFO can not hang the open), and a write goes to a
//! temporary file created exclusively (`O_CREAT | O_EXCL`, mode 0600) under a random name in
//! the same folder, is synced, and renamed into place: a planted temporary name or link is
//! replaced, never written through.
//!
//! The calls block (they are system calls on a local folder); async callers use
//! [`crate::workspace`], which runs them on the blocking pool.
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Why a workspace file was not read or written.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceFileError {
    #[error("{0:?} is not a plain file name")]
    NotAName(String),
    #[error("{0} is a symbolic link (links in a workspace are never followed)")]
    Link(PathBuf),
    #[error("{path} is a {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} has {links} hard links (only a file of its own is read)")]
    HardLinked { path: PathBuf, links: u64 },
    #[error("{path} is larger than {cap} bytes: not read")]
    TooLarge { path: PathBuf, cap: u64 },
    #[error("{0} is not UTF-8 text")]
    NotText(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl WorkspaceFileError {
    /// A short label for logs and metrics (`link`, `fifo`, `too_large`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotAName(_) => "not_a_name",
            Self::Link(_) => "link",
            Self::NotRegular { kind, .. } => kind,
            Self::HardLinked { .. } => "hard_linked",
            Self::TooLarge { .. } => "too_large",
            Self::NotText(_) => "not_text",
            Self::Io { .. } => "io",
        }
    }

    /// Something in the workspace is not what the dispatcher put there (a link, a FIFO, a
    /// huge or hard-linked file): the agent's doing, not an I/O failure.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, Self::Io { .. })
    }
}

impl From<WorkspaceFileError> for io::Error {
    fn from(e: WorkspaceFileError) -> Self {
        match e {
            WorkspaceFileError::Io { source, .. } => source,
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// An open folder of a workspace (the workspace itself or one of its sub-folders).
#[derive(Debug)]
pub struct WorkspaceDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// A name of one component: not empty, no `/`, not `.` or `..`, no NUL.
fn plain_name(name: &str) -> Result<&str, WorkspaceFileError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(WorkspaceFileError::NotAName(name.to_string()));
    }
    Ok(name)
}

fn kind_of(file_type: FileType) -> &'static str {
    match file_type {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "link",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "unknown file type",
    }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl WorkspaceDir {
    /// Open the workspace folder `path`. Its parent (the operator's `workspace.root`, which
    /// may be a link of theirs) is followed; the folder itself must be a real folder, not a
    /// link an agent put in its place.
    pub fn open(path: &Path) -> Result<Self, WorkspaceFileError> {
        let (parent, name) = match (path.parent(), path.file_name()) {
            (Some(p), Some(n)) => (
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                },
                n,
            ),
            _ => return Err(WorkspaceFileError::NotAName(path.display().to_string())),
        };
        let io = |source: Errno| WorkspaceFileError::Io {
            path: path.to_path_buf(),
            source: source.into(),
        };
        let parent_fd = rustix::fs::open(
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io)?;
        Self::open_in(&parent_fd, name, path.to_path_buf())
    }

    /// Make the workspace folder `path` (and its parents) unless it exists, then open it.
    pub fn create(path: &Path) -> Result<Self, WorkspaceFileError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| WorkspaceFileError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        match std::fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(WorkspaceFileError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        Self::open(path)
    }

    fn open_in(parent: &OwnedFd, name: &OsStr, path: PathBuf) -> Result<Self, WorkspaceFileError> {
        match rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => Ok(Self { fd, path }),
            // O_NOFOLLOW on a link: ELOOP (Linux), EMLINK (FreeBSD); O_DIRECTORY on something
            // else: ENOTDIR. Say which it is.
            Err(Errno::LOOP | Errno::MLINK | Errno::NOTDIR) => Err(
                match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                        WorkspaceFileError::Link(path)
                    }
                    Ok(st) => WorkspaceFileError::NotRegular {
                        kind: kind_of(FileType::from_raw_mode(st.st_mode)),
                        path,
                    },
                    Err(e) => WorkspaceFileError::Io {
                        path,
                        source: e.into(),
                    },
                },
            ),
            Err(e) => Err(WorkspaceFileError::Io {
                path,
                source: e.into(),
            }),
        }
    }

    /// The folder's path (for messages; never reopened by it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The sub-folder `name`, made first if `create` and it does not exist. A link in its
    /// place is refused.
    pub fn dir(&self, name: &str, create: bool) -> Result<WorkspaceDir, WorkspaceFileError> {
        let name = plain_name(name)?;
        let path = self.path.join(name);
        if create {
            match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => {
                    return Err(WorkspaceFileError::Io {
                        path,
                        source: e.into(),
                    });
                }
            }
        }
        Self::open_in(&self.fd, OsStr::new(name), path)
    }

    /// The file `name`, if it is a regular file of its own of at most `cap` bytes (`None`:
    /// there is no such file). Anything else is refused without reading past the cap.
    pub fn read(&self, name: &str, cap: u64) -> Result<Option<Vec<u8>>, WorkspaceFileError> {
        let name = plain_name(name)?;
        let path = self.path.join(name);
        // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP | Errno::MLINK) => return Err(WorkspaceFileError::Link(path)),
            Err(e) => {
                return Err(WorkspaceFileError::Io {
                    path,
                    source: e.into(),
                });
            }
        };
        let io = |path: &Path, e: io::Error| WorkspaceFileError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| io(&path, e.into()))?;
        let file_type = FileType::from_raw_mode(st.st_mode);
        if file_type != FileType::RegularFile {
            return Err(WorkspaceFileError::NotRegular {
                path,
                kind: kind_of(file_type),
            });
        }
        // A hard link to a file elsewhere would be read as if the agent had written it.
        if st.st_nlink as u64 > 1 {
            return Err(WorkspaceFileError::HardLinked {
                path,
                links: st.st_nlink as u64,
            });
        }
        if st.st_size as u64 > cap {
            return Err(WorkspaceFileError::TooLarge { path, cap });
        }
        // Read at most one byte past the cap, whatever the size said (it may grow meanwhile).
        let mut body = Vec::with_capacity(st.st_size as usize);
        std::fs::File::from(fd)
            .take(cap + 1)
            .read_to_end(&mut body)
            .map_err(|e| io(&path, e))?;
        if body.len() as u64 > cap {
            return Err(WorkspaceFileError::TooLarge { path, cap });
        }
        Ok(Some(body))
    }

    /// [`Self::read`] as UTF-8 text.
    pub fn read_text(&self, name: &str, cap: u64) -> Result<Option<String>, WorkspaceFileError> {
        match self.read(name, cap)? {
            None => Ok(None),
            Some(body) => String::from_utf8(body)
                .map(Some)
                .map_err(|_| WorkspaceFileError::NotText(self.path.join(name))),
        }
    }

    /// Put `body` in place as `name`: written to a new file under a random name (created
    /// exclusively, 0600), synced, then renamed over `name`. Whatever was at `name` (a link,
    /// a FIFO) is replaced, not written through; a folder there makes the rename fail.
    pub fn write(&self, name: &str, body: &[u8]) -> Result<(), WorkspaceFileError> {
        let name = plain_name(name)?;
        let path = self.path.join(name);
        let tmp = format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple());
        let io = |e: io::Error| WorkspaceFileError::Io {
            path: path.clone(),
            source: e,
        };
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, tmp.as_str(), flags, Mode::from_raw_mode(0o600))
            .map_err(|e| io(e.into()))?;
        let mut file = std::fs::File::from(fd);
        let written = file.write_all(body).and_then(|()| file.sync_all());
        let renamed = written.and_then(|()| {
            rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name).map_err(io::Error::from)
        });
        if let Err(e) = renamed {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
            return Err(io(e));
        }
        // The rename is durable once the folder is synced.
        let _ = rustix::fs::fsync(&self.fd);
        Ok(())
    }

    /// Make an empty file `name` unless something is there already.
    pub fn create_empty(&self, name: &str) -> Result<(), WorkspaceFileError> {
        let name = plain_name(name)?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(&self.fd, name, flags, Mode::from_raw_mode(0o644)) {
            Ok(_) | Err(Errno::EXIST) => Ok(()),
            Err(e) => Err(WorkspaceFileError::Io {
                path: self.path.join(name),
                source: e.into(),
            }),
        }
    }

    /// The regular files in this folder, with their sizes (links, FIFOs, folders and names
    /// that are not UTF-8 are left out).
    pub fn regular_files(&self) -> Result<Vec<(String, u64)>, WorkspaceFileError> {
        Ok(self
            .listed_files()?
            .into_iter()
            .map(|f| (f.name, f.bytes))
            .collect())
    }

    /// [`Self::regular_files`] with each one's modification time, by name.
    pub fn listed_files(&self) -> Result<Vec<ListedFile>, WorkspaceFileError> {
        Ok(self.listed()?.0)
    }

    /// The entries that are neither regular files nor folders (links, FIFOs, sockets,
    /// devices), by name, with what each is (`link`, `fifo`, …), sorted by name.
    pub fn listed_others(&self) -> Result<Vec<(String, &'static str)>, WorkspaceFileError> {
        Ok(self.listed()?.1)
    }

    #[allow(clippy::type_complexity)]
    fn listed(&self) -> Result<(Vec<ListedFile>, Vec<(String, &'static str)>), WorkspaceFileError> {
        let io = |e: Errno| WorkspaceFileError::Io {
            path: self.path.clone(),
            source: e.into(),
        };
        let mut out = Vec::new();
        let mut others = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd).map_err(io)? {
            let entry = entry.map_err(io)?;
            let Ok(name) = std::str::from_utf8(entry.file_name().to_bytes()) else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let Ok(st) = rustix::fs::statat(
                &self.fd,
                OsStr::from_bytes(name.as_bytes()),
                AtFlags::SYMLINK_NOFOLLOW,
            ) else {
                continue;
            };
            if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile {
                let modified = std::time::UNIX_EPOCH
                    + std::time::Duration::new(
                        st.st_mtime.max(0) as u64,
                        (st.st_mtime_nsec as u32).min(999_999_999),
                    );
                out.push(ListedFile {
                    name: name.to_string(),
                    bytes: st.st_size as u64,
                    modified,
                });
            } else if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                others.push((
                    name.to_string(),
                    kind_of(FileType::from_raw_mode(st.st_mode)),
                ));
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        others.sort();
        Ok((out, others))
    }
}

/// A regular file as [`WorkspaceDir::listed_files`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedFile {
    pub name: String,
    pub bytes: u64,
    /// Its `st_mtime`: when its content last changed (the agent may set it as it likes).
    pub modified: std::time::SystemTime,
}

#[cfg(test)]
#[path = "workspace_fs_tests.rs"]
mod tests;
