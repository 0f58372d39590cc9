//! What an agent can plant in its workspace, and what the dispatcher's file access makes of it.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::*;

/// A workspace folder and, beside it (outside the workspace), a canary file.
fn workspace() -> (PathBuf, PathBuf, PathBuf) {
    let base = std::env::temp_dir().join(format!("sb-wsfs-{}", uuid::Uuid::new_v4().simple()));
    let ws = base.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let canary = base.join("canary.txt");
    std::fs::write(&canary, "CANARY secret of the host").unwrap();
    (base, ws, canary)
}

#[test]
fn a_link_is_refused_and_never_followed_for_reading() {
    let (base, ws, canary) = workspace();
    std::os::unix::fs::symlink(&canary, ws.join("memory.md")).unwrap();
    let dir = WorkspaceDir::open(&ws).unwrap();
    let got = dir.read_text("memory.md", 1 << 20);
    assert!(matches!(got, Err(WorkspaceFileError::Link(_))), "{got:?}");
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn a_write_replaces_a_planted_link_or_temporary_name_and_never_writes_through_it() {
    let (base, ws, canary) = workspace();
    std::os::unix::fs::symlink(&canary, ws.join("memory.md")).unwrap();
    // The fixed temporary names of earlier versions, planted as links.
    std::os::unix::fs::symlink(&canary, ws.join(".memory.md.tmp")).unwrap();
    std::os::unix::fs::symlink(&canary, ws.join(".memory.md.part")).unwrap();
    let dir = WorkspaceDir::open(&ws).unwrap();
    dir.write("memory.md", b"- stored memory").unwrap();
    assert_eq!(
        std::fs::read_to_string(&canary).unwrap(),
        "CANARY secret of the host"
    );
    let meta = std::fs::symlink_metadata(ws.join("memory.md")).unwrap();
    assert!(meta.file_type().is_file(), "the link was replaced");
    assert_eq!(
        std::fs::read_to_string(ws.join("memory.md")).unwrap(),
        "- stored memory"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn a_fifo_is_refused_at_once() {
    let (base, ws, _) = workspace();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        ws.join("memory.md").as_path(),
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let dir = WorkspaceDir::open(&ws).unwrap();
    let started = Instant::now();
    let got = dir.read("memory.md", 1 << 20);
    assert!(
        matches!(
            got,
            Err(WorkspaceFileError::NotRegular { kind: "fifo", .. })
        ),
        "{got:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn a_huge_file_is_refused_without_being_read() {
    let (base, ws, _) = workspace();
    let file = std::fs::File::create(ws.join("memory.md")).unwrap();
    file.set_len(1 << 30).unwrap(); // 1 GB, sparse
    let dir = WorkspaceDir::open(&ws).unwrap();
    let started = Instant::now();
    let got = dir.read("memory.md", 1 << 20);
    assert!(
        matches!(got, Err(WorkspaceFileError::TooLarge { cap, .. }) if cap == 1 << 20),
        "{got:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn a_hard_link_to_a_file_elsewhere_is_refused() {
    let (base, ws, canary) = workspace();
    std::fs::hard_link(&canary, ws.join("memory.md")).unwrap();
    let dir = WorkspaceDir::open(&ws).unwrap();
    let got = dir.read("memory.md", 1 << 20);
    assert!(
        matches!(got, Err(WorkspaceFileError::HardLinked { links: 2, .. })),
        "{got:?}"
    );
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn a_workspace_or_sub_folder_replaced_by_a_link_is_refused() {
    let (base, ws, _) = workspace();
    let elsewhere = base.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, ws.join("attachments")).unwrap();
    let dir = WorkspaceDir::open(&ws).unwrap();
    let got = dir.dir("attachments", true);
    assert!(matches!(got, Err(WorkspaceFileError::Link(_))), "{got:?}");

    let linked = base.join("linked-ws");
    std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
    let got = WorkspaceDir::open(&linked);
    assert!(matches!(got, Err(WorkspaceFileError::Link(_))), "{got:?}");
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn names_are_single_components() {
    let (base, ws, _) = workspace();
    let dir = WorkspaceDir::open(&ws).unwrap();
    for name in ["../canary.txt", "..", ".", "", "a/b"] {
        assert!(
            matches!(dir.read(name, 10), Err(WorkspaceFileError::NotAName(_))),
            "{name}"
        );
        assert!(matches!(
            dir.write(name, b"x"),
            Err(WorkspaceFileError::NotAName(_))
        ));
    }
    std::fs::remove_dir_all(base).unwrap();
}

#[test]
fn plain_files_read_back_and_listing_skips_anything_else() {
    let (base, ws, canary) = workspace();
    let dir = WorkspaceDir::open(&ws).unwrap();
    assert_eq!(dir.read("memory.md", 10).unwrap(), None);
    dir.write("memory.md", b"hello").unwrap();
    assert_eq!(
        dir.read_text("memory.md", 5).unwrap().as_deref(),
        Some("hello")
    );
    assert!(matches!(
        dir.read("memory.md", 4),
        Err(WorkspaceFileError::TooLarge { .. })
    ));
    std::os::unix::fs::symlink(&canary, ws.join("m-0.jpg")).unwrap();
    dir.dir("sub", true).unwrap();
    assert_eq!(dir.regular_files().unwrap(), [("memory.md".to_string(), 5)]);
    std::fs::remove_dir_all(base).unwrap();
}
