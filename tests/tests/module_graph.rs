//! The gateway and the kit have no import circle: no module names, through `crate::<module>`,
//! a module that names it back (directly or round a longer loop). A circle is where a change in
//! one room forces a change in the other, and where a newcomer cannot read one without the
//! other. Each top-level module (a file, or a folder with its `mod.rs`) is one room; the crate
//! root, which declares them all, is not.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Module -> the modules it names, for the crate whose sources are in `src`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_string();
        if !modules.contains(&module) {
            continue; // the crate root
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // A module's own tests may reach anywhere; a comment's link to a module is a pointer
        // for the reader, not an import.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or_default()
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("//") {
                    ""
                } else {
                    l.split("//").next().unwrap_or_default()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let named = graph.entry(module.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let after = &code[i + "crate::".len()..];
            let target: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::{a, b}` names the root's items; `crate::x` a module when x is one.
            if modules.contains(&target) && target != module {
                named.insert(target);
            }
        }
    }
    graph
}

/// Every circle of `graph`, each as the modules round it.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut found = BTreeSet::new();
    for start in graph.keys() {
        // Depth-first from `start`, back to it.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, path)) = stack.pop() {
            for next in graph.get(&at).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    let least = circle.iter().min().unwrap().clone();
                    let k = circle.iter().position(|m| *m == least).unwrap();
                    circle.rotate_left(k);
                    found.insert(circle);
                } else if !path.contains(next) && path.len() < 12 {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found.into_iter().collect()
}

#[test]
fn the_gateway_and_the_kit_have_no_import_circle() {
    for krate in ["services/gateway/src", "services/kit/src"] {
        let graph = module_graph(&repo().join(krate));
        assert!(graph.len() > 5, "{krate}: {graph:?}");
        let found = circles(&graph);
        assert!(found.is_empty(), "{krate} has import circles: {found:?}");
    }
}

#[test]
fn a_circle_is_found_when_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&graph), [vec!["a", "b", "c"]]);
}
