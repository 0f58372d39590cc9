//! The deploy files (deploy/: the image's Dockerfile, compose.yaml, the Kubernetes manifests, the
//! alert rules and dashboard) are checked offline the way an operator's CI would: Kubernetes'
//! own schemas (strict), the Compose specification's schema, hadolint, promtool, and against
//! the product itself: a Deployment, budget and ScaledObject for every worker the product has,
//! scaled on the consumers that worker reads; the versions the stack pins; the NATS users'
//! rights the stack gives; the metrics the product serves. A broken file fails its check.
//!
//! The checkers are fetched once (deploy/check/tools.sh: PyPI and Debian's archive).
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use switchboard_kit::Topology;
use switchboard_kit::config::RuntimeConfig;
use switchboard_stack::credentials::Credentials;
use switchboard_stack::{nats, pins};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// The folder holding the checkers (fetched on first use).
fn tools() -> PathBuf {
    let out = Command::new(repo().join("deploy/check/tools.sh"))
        .output()
        .expect("deploy/check/tools.sh runs");
    assert!(
        out.status.success(),
        "deploy/check/tools.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// What the deploy files must agree with, from the product's own lists.
fn expectations(dir: &Path) -> PathBuf {
    let rt = RuntimeConfig::default();
    let topology = Topology::new("sb", rt.turn_partitions);
    let mut workers = serde_json::Map::new();
    for r in switchboard::stages::ALL {
        let reads = workers
            .entry(r.worker)
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .unwrap();
        reads.push(json!([topology.stream_of(r.spec.reads), r.spec.name]));
    }
    // The stack's NATS users, rendered for the prefix the deploy files use.
    let credentials = Credentials {
        nats_password: "p".into(),
        analytics_password: "a".into(),
        pg_password: String::new(),
        pg_super_password: String::new(),
    };
    let authorization = nats::authorization(&nats::ConfInput {
        name: "deploy",
        nats_port: 4222,
        monitor_port: 8222,
        pid_file: Path::new("nats.pid"),
        store_dir: Path::new("data"),
        cred_dir: Path::new("credentials"),
        credentials: &credentials,
        fingerprint: "-",
        prefixes: "sb",
        analytics: "sb",
        sync_always: false,
        readers: &[],
    })
    .expect("the stack renders its users");
    let reference = dir.join("stack-nats.conf");
    std::fs::write(&reference, authorization).unwrap();
    let expect = json!({
        "workers": workers,
        "drain_s": rt.shutdown_grace_ms / 1000,
        "nats_reference": reference,
        "pins": {
            "nats": pins::NATS_VERSION,
            "MODEL_PKG": format!("{}=={}", pins::MODEL_PKG, pins::MODEL_VERSION),
            "ORT_PKG": format!("{}=={}", pins::ORT_PKG, pins::ORT_VERSION),
            "ONNX_TOOLS": pins::ONNX_TOOLS.join(" "),
        },
    });
    let path = dir.join("expect.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&expect).unwrap()).unwrap();
    path
}

/// Run the checks over the deploy folder `deploy`: (passed, the report).
fn check(deploy: &Path) -> (bool, String) {
    let scratch = std::env::temp_dir().join(format!("sb-deploy-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&scratch).unwrap();
    let out = Command::new("python3")
        .arg(repo().join("deploy/check/check_deploy.py"))
        .arg("--tools")
        .arg(tools())
        .arg("--deploy")
        .arg(deploy)
        .arg("--repo")
        .arg(repo())
        .arg("--expect")
        .arg(expectations(&scratch))
        .output()
        .expect("python3 runs");
    let _ = std::fs::remove_dir_all(&scratch);
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), report)
}

/// A copy of deploy/ to break.
fn copy_of_deploy() -> PathBuf {
    let to = std::env::temp_dir().join(format!("sb-deploy-copy-{}", uuid::Uuid::new_v4()));
    let status = Command::new("cp")
        .arg("-r")
        .arg(repo().join("deploy"))
        .arg(&to)
        .status()
        .unwrap();
    assert!(status.success());
    to
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn the_shipped_deploy_files_pass_every_check() {
    let (passed, report) = check(&repo().join("deploy"));
    assert!(passed, "{report}");
    // Every check ran (a check that silently did nothing would not print its line).
    for check in [
        "kubernetes: strict schemas",
        "kubernetes: ScaledObjects",
        "kubernetes: a Deployment, budget and ScaledObject per worker",
        "compose: the Compose specification's schema",
        "compose: NATS users' rights are the stack's",
        "compose: published ports are bound to loopback",
        "image: hadolint",
        "image: the embedder's versions are the stack's pins",
        "grafana: promtool check rules",
        "grafana: every metric named exists",
    ] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with(&format!("ok {check}"))),
            "{check} did not pass:\n{report}"
        );
    }
}

#[test]
fn a_broken_deploy_file_fails_its_check_and_says_where() {
    let cases: &[(&str, &str, &str, &str)] = &[
        // A misspelt field Kubernetes would refuse (or worse, ignore).
        (
            "kubernetes/worker-dispatch.yaml",
            "terminationGracePeriodSeconds",
            "terminationGracePeriodSecond",
            "FAIL kubernetes: strict schemas",
        ),
        // KEDA's trigger metadata is a map of strings: a bare number is refused at apply.
        (
            "kubernetes/worker-session.yaml",
            "lagThreshold: \"200\"",
            "lagThreshold: 200",
            "FAIL kubernetes: ScaledObjects",
        ),
        // A ScaledObject watching a consumer no stage has never scales.
        (
            "kubernetes/worker-deliver.yaml",
            "consumer: \"deliver\"",
            "consumer: \"delivery\"",
            "FAIL kubernetes: a Deployment, budget and ScaledObject per worker",
        ),
        (
            "compose.yaml",
            "stop_grace_period: 30s",
            "stop_grace_periods: 30s",
            "FAIL compose: the Compose specification's schema",
        ),
        // NATS published on every interface (the default when no host address is given).
        (
            "compose.yaml",
            "\"127.0.0.1:4222:4222\"",
            "\"4222:4222\"",
            "FAIL compose: published ports are bound to loopback",
        ),
        (
            "compose.yaml",
            "${SB_GATEWAY_ADDR:-127.0.0.1}:8080:8080",
            "${SB_GATEWAY_ADDR:-0.0.0.0}:8080:8080",
            "FAIL compose: published ports are bound to loopback",
        ),
        (
            "compose/nats.conf",
            "\"sb.forget\", \"sb.events.>\"",
            "\"sb.forget\", \"sb.events.>\", \"sb.>\"",
            "FAIL compose: NATS users' rights are the stack's",
        ),
        (
            "grafana/alerts.yaml",
            "expr: max(sb_embed_lag_seconds) > 300",
            "expr: max(sb_embed_lag_seconds > 300",
            "FAIL grafana: promtool check rules",
        ),
        (
            "grafana/alerts.yaml",
            "sb_delivery_failed_total[15m]",
            "sb_deliveries_failed_total[15m]",
            "FAIL grafana: every metric named exists",
        ),
        (
            "image/Dockerfile",
            "ARG ORT_PKG=onnxruntime==",
            "ARG ORT_PKG=onnxruntime==0.",
            "FAIL image: the embedder's versions are the stack's pins",
        ),
    ];
    for (file, from, to, failure) in cases {
        let deploy = copy_of_deploy();
        edit(&deploy.join(file), from, to);
        let (passed, report) = check(&deploy);
        let _ = std::fs::remove_dir_all(&deploy);
        assert!(!passed, "{file} broken ({to:?}) passed:\n{report}");
        assert!(
            report.lines().any(|l| l.starts_with(failure)),
            "{file} broken ({to:?}) did not fail {failure:?}:\n{report}"
        );
    }
}
