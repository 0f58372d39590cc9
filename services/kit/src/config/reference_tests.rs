//! docs/configuration.md lists every configuration key with its default, generated from
//! `Config::default()`: a key added, renamed or removed, or a default changed, fails this test
//! until the page is regenerated (`SB_UPDATE_DOCS=1 cargo test -p switchboard-kit
//! configuration_reference`), so the page cannot drift from the code.
use serde_json::Value;

use super::Config;

const BEGIN: &str = "<!-- keys:begin (generated: SB_UPDATE_DOCS=1 cargo test -p switchboard-kit configuration_reference) -->";
const END: &str = "<!-- keys:end -->";

/// Every leaf key of `value` as `section.key`, with its default as TOML would write it.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Object(_) => out.push((prefix.to_string(), "(a table; none by default)".into())),
        Value::Array(items) if items.iter().any(Value::is_object) || items.is_empty() => {
            let shown = if items.is_empty() {
                "(none by default)".to_string()
            } else {
                format!("({} by default)", items.len())
            };
            out.push((prefix.to_string(), shown));
        }
        Value::Null => out.push((prefix.to_string(), "(unset)".into())),
        Value::String(s) if s.is_empty() => out.push((prefix.to_string(), "\"\"".into())),
        other => {
            let shown = other.to_string().replace('|', "\\|");
            out.push((prefix.to_string(), shown));
        }
    }
}

fn generated() -> String {
    let value = serde_json::to_value(Config::default()).expect("the configuration serializes");
    let mut keys = Vec::new();
    flatten("", &value, &mut keys);
    keys.sort();
    let mut out = format!("{BEGIN}\n\n| key | default |\n| --- | --- |\n");
    for (key, default) in keys {
        out.push_str(&format!("| `{key}` | `{default}` |\n"));
    }
    out.push('\n');
    out.push_str(END);
    out
}

#[test]
fn configuration_reference_lists_every_key_with_its_default() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let page = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let (Some(start), Some(end)) = (page.find(BEGIN), page.find(END)) else {
        panic!("docs/configuration.md has no generated block ({BEGIN} … {END})");
    };
    let current = &page[start..end + END.len()];
    let wanted = generated();
    if current != wanted {
        if std::env::var_os("SB_UPDATE_DOCS").is_some() {
            let updated = format!("{}{wanted}{}", &page[..start], &page[end + END.len()..]);
            std::fs::write(&path, updated).expect("write docs/configuration.md");
            return;
        }
        let have: std::collections::BTreeSet<&str> = current.lines().collect();
        let want: std::collections::BTreeSet<&str> = wanted.lines().collect();
        let missing: Vec<_> = want.difference(&have).collect();
        let stale: Vec<_> = have.difference(&want).collect();
        panic!(
            "docs/configuration.md is out of date; regenerate it with SB_UPDATE_DOCS=1 cargo \
             test -p switchboard-kit configuration_reference.\nmissing: {missing:#?}\nstale: {stale:#?}"
        );
    }
}
