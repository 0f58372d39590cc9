//! Tried as a new user would: with `make run` up, `switchboard <verb>` in a second terminal, with
//! nothing set in that shell, finds the embedded stack's credentials by itself (its
//! `.stack/run/credentials/env`) instead of failing with "password authentication failed".
use std::path::Path;
use std::process::Output;

use switchboard_e2e::{fresh_database, switchboard_bin};

/// `switchboard args…` run in `dir` with no `SB_*` variable and no configuration file.
fn second_terminal(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new(switchboard_bin());
    cmd.args(args).current_dir(dir);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SB_") {
            cmd.env_remove(k);
        }
    }
    cmd.output().expect("run the switchboard CLI")
}

#[tokio::test]
async fn the_cli_beside_the_embedded_stack_needs_no_setup() {
    // A checkout with `make run`'s stack up: its credentials file, as the stack writes it (here
    // naming the test stack's servers and a database of this test's own).
    let nats = std::env::var("SB_NATS_URL").expect("SB_NATS_URL");
    let database = fresh_database(&std::env::var("SB_DATABASE_URL").unwrap()).await;
    let checkout =
        std::env::temp_dir().join(format!("sb-checkout-{}", uuid::Uuid::new_v4().simple()));
    let creds = checkout.join(".stack/run/credentials");
    std::fs::create_dir_all(&creds).unwrap();
    std::fs::write(
        creds.join("env"),
        format!("export SB_NATS_URL={nats}\nexport SB_DATABASE_URL={database}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(checkout.join("services")).unwrap();

    let said = |out: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let migrated = second_terminal(&checkout, &["migrate"]);
    assert!(migrated.status.success(), "{}", said(&migrated));
    // From a folder below the checkout's root too.
    let made = second_terminal(
        &checkout.join("services"),
        &["api-keys", "create", "--owner", "crm"],
    );
    assert!(made.status.success(), "{}", said(&made));
    let listed = second_terminal(&checkout, &["api-keys", "list"]);
    assert!(listed.status.success(), "{}", said(&listed));
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("crm"),
        "{}",
        said(&listed)
    );
    let _ = std::fs::remove_dir_all(&checkout);
}
