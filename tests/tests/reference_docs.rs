//! The reference pages cannot drift from the product: docs/http.md lists every route the source
//! declares, and each row answers on its address and method; docs/events.md lists every event
//! of proto/switchboard/v1/events.proto with its message type.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use switchboard_e2e::spawn_app_configured;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every string literal that follows `.route(` in `text` (the literal routes), and every
/// `"/webhooks/…"` literal (the channel adapters' `route()`).
fn declared_routes(text: &str, out: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(i) = rest.find(".route(") {
        rest = &rest[i + ".route(".len()..];
        let trimmed = rest.trim_start();
        if let Some(lit) = trimmed.strip_prefix('"') {
            out.insert(lit[..lit.find('"').unwrap()].to_string());
        }
    }
    for (i, _) in text.match_indices("\"/webhooks/") {
        let lit = &text[i + 1..];
        out.insert(lit[..lit.find('"').unwrap()].to_string());
    }
}

/// The rows of docs/http.md: (method, path, addresses).
fn documented() -> Vec<(String, String, Vec<String>)> {
    read("docs/http.md")
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("| `/"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let path = cells[1].trim_matches('`').to_string();
            let addresses = cells[2].split(',').map(|a| a.trim().to_string()).collect();
            (cells[0].to_string(), path, addresses)
        })
        .collect()
}

#[test]
fn every_route_the_source_declares_is_in_the_http_reference() {
    let mut files = Vec::new();
    rust_files(&repo().join("services/gateway/src"), &mut files);
    rust_files(&repo().join("services/channels/src"), &mut files);
    files.push(repo().join("services/kit/src/admin.rs"));
    files.push(repo().join("services/switchboard/src/demo.rs"));
    let mut declared = BTreeSet::new();
    for f in files
        .iter()
        .filter(|f| !f.to_string_lossy().ends_with("tests.rs"))
    {
        let text = std::fs::read_to_string(f).unwrap();
        // The product's code only: a file's test module names made-up routes.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        declared_routes(code, &mut declared);
    }
    // A route's prefix used in a message, not a route.
    declared.retain(|r| !r.ends_with('/'));
    let documented: BTreeSet<String> = documented().into_iter().map(|(_, p, _)| p).collect();
    let missing: Vec<_> = declared.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "routes missing from docs/http.md: {missing:?}"
    );
    let stale: Vec<_> = documented.difference(&declared).collect();
    assert!(
        stale.is_empty(),
        "docs/http.md lists routes nothing declares: {stale:?}"
    );
}

#[tokio::test]
async fn every_documented_endpoint_answers_on_its_address_and_method() {
    let app = spawn_app_configured(|c| c.demo.enabled = true).await;
    let http = reqwest::Client::new();
    let rows = documented();
    assert!(rows.len() > 30, "{rows:?}");
    for (method, path, addresses) in rows {
        let concrete = path
            .replace("{id}", "0190f0f0-0000-7000-8000-000000000000")
            .replace("{correlation_id}", "0190f0f0-0000-7000-8000-000000000000")
            .replace("{from}", "phone:+14155550000")
            .replace("{to}", "phone:+14155550001")
            .replace("{channel}", "admin_chat")
            .replace("{seq}", "999999")
            .replace("{token}", "wrong-token")
            .replace("{source}", "nosuch")
            .replace("{*rest}", "nosuch/path");
        let method = match method.as_str() {
            "ANY" => reqwest::Method::GET,
            m => m.parse().unwrap(),
        };
        for address in addresses {
            let base = match address.as_str() {
                "public" | "demo" => &app.gateway_url,
                "admin" => &app.admin_url,
                other => panic!("unknown address {other} for {path}"),
            };
            let res = http
                .request(method.clone(), format!("{base}{concrete}"))
                .send()
                .await
                .unwrap();
            let status = res.status();
            let body = res.bytes().await.unwrap();
            // The router's own refusals: no such path (404, no body), wrong method (405).
            assert!(
                status != 405 && !(status == 404 && body.is_empty()),
                "{method} {path} on {address}: {status}"
            );
        }
    }
}

#[test]
fn every_event_of_the_schema_is_in_the_events_reference_with_its_type() {
    let proto = read("proto/switchboard/v1/events.proto");
    let mut schema = BTreeSet::new();
    let mut pending: Option<String> = None;
    for line in proto.lines() {
        if let Some(rest) = line.strip_prefix("// sb.events.") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                .collect();
            pending = Some(name.trim_end_matches('.').to_string());
        } else if let Some(rest) = line.strip_prefix("message ") {
            let ty = rest.split_whitespace().next().unwrap();
            if let Some(name) = pending.take() {
                schema.insert((name, format!("switchboard.v1.{ty}")));
            }
        }
    }
    assert!(schema.len() >= 10, "{schema:?}");
    let documented: BTreeSet<(String, String)> = read("docs/events.md")
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (
                cells[0].trim_matches('`').to_string(),
                cells[1].trim_matches('`').to_string(),
            )
        })
        .collect();
    assert_eq!(documented, schema, "docs/events.md against events.proto");
}
