//! The README is a quickstart a newcomer reads in minutes, and what it and the docs point to is
//! there: every relative link resolves, every test file the README names as a proof exists.
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The targets of `[text](target)` links that stay inside the repository.
fn relative_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        if !target.contains("://") && !target.starts_with('#') && !target.starts_with("mailto:") {
            out.push(target.split('#').next().unwrap_or_default().to_string());
        }
    }
    out
}

fn markdown_pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages
}

#[test]
fn the_readme_is_short() {
    let size = std::fs::metadata(root().join("README.md")).unwrap().len();
    assert!(
        size < 15_000,
        "README.md is {size} bytes: move detail into docs/"
    );
}

#[test]
fn every_relative_link_in_the_readme_and_the_docs_resolves() {
    let mut broken = Vec::new();
    for page in markdown_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for target in relative_links(&text) {
            if !target.is_empty() && !dir.join(&target).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
}

#[test]
fn every_test_the_readme_names_as_a_proof_exists() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut missing = Vec::new();
    let mut named = 0;
    for (i, part) in text.split('`').enumerate() {
        // Odd parts are inside backticks.
        if i % 2 == 0 || !part.ends_with(".rs") || part.contains(' ') {
            continue;
        }
        named += 1;
        let found = if part.contains('/') {
            root().join(part).exists()
        } else {
            root().join("tests/tests").join(part).exists()
        };
        if !found {
            missing.push(part.to_string());
        }
    }
    assert!(named > 20, "the README names its proofs ({named} found)");
    assert!(
        missing.is_empty(),
        "named as proofs but not there: {missing:?}"
    );
}
