//! `switchboard api-keys` as a provisioning script uses it: `--json` gives the key once with its
//! id and scopes; the key works at once, is listed (never the key itself), and stops working
//! the moment it is revoked.
use serde_json::{Value, json};
use switchboard_e2e::spawn_app;

#[tokio::test]
async fn a_script_makes_lists_and_revokes_an_api_key_with_json() {
    let app = spawn_app().await;
    let made = app
        .cli_json(&[
            "api-keys",
            "create",
            "--owner",
            "crm",
            "--scope",
            "messages:write",
            "--json",
        ])
        .await;
    let key = made["key"].as_str().expect("the key, once").to_string();
    let id = made["id"].as_str().unwrap().to_string();
    assert_eq!(made["owner"], "crm");
    assert_eq!(made["scopes"], json!(["messages:write"]));
    assert!(
        key.starts_with(made["key_prefix"].as_str().unwrap()),
        "{made}"
    );

    let sent = app
        .post_api_message(&key, json!({"text": "hello from the crm"}), None)
        .await;
    assert_eq!(sent.status(), 202, "the new key works");

    let listed = app.cli_json(&["api-keys", "list", "--json"]).await;
    let ours = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == id.as_str())
        .expect("listed");
    assert_eq!(ours["revoked_at"], Value::Null);
    assert!(
        !listed.to_string().contains(&key),
        "a listing never shows a key"
    );

    let revoked = app.cli_json(&["api-keys", "revoke", &id, "--json"]).await;
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    let refused = app
        .post_api_message(&key, json!({"text": "still there?"}), None)
        .await;
    assert_eq!(refused.status(), 401, "a revoked key stops working at once");
    app.shutdown().await;
}
