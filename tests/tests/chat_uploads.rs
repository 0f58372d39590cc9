//! A chat user uploads a file (`POST /chat/uploads`, the socket's token) and sends a message
//! naming it: the file lands in the session's workspace (`attachments/`), byte for byte, and
//! the prompt lists it. Uploads are capped, only their owner may name them, and they are
//! deleted after their retention.
use std::time::Duration;

use serde_json::json;
use switchboard_e2e::chat::{ChatClient, chat_token, upload};
use switchboard_e2e::spawn_app_configured;
use switchboard_kit::proto::{InboundMessage, Person};
use switchboard_kit::runtime::{Output, Runtime};

const WAIT: Duration = Duration::from_secs(20);

fn workspace_root() -> (std::path::PathBuf, String) {
    let root = std::env::temp_dir().join(format!("sb-up-{}", uuid::Uuid::new_v4().simple()));
    let text = root.to_string_lossy().into_owned();
    (root, text)
}

#[tokio::test]
async fn a_file_uploaded_in_chat_is_kept_in_the_workspace_and_listed_in_the_prompt() {
    let (root, root_text) = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root_text;
        c.workspace.max_attachment_bytes = 1_000;
    })
    .await;
    let ana = chat_token("ana", json!({}));
    let report: Vec<u8> = (0..700u32).map(|i| (i * 7 % 256) as u8).collect();
    let stored = upload(
        &app.gateway_url,
        &ana,
        "Q3 report.pdf",
        "application/pdf",
        report.clone(),
    )
    .await;
    assert_eq!(stored.status, 201, "{stored:?}");
    assert_eq!(stored.body["bytes"], 700);
    assert_eq!(stored.body["name"], "Q3_report.pdf");

    let mut client = ChatClient::as_user(&app.gateway_url, "ana").await;
    client
        .say_with_files("m-1", "what does this say?", &[&stored.id()])
        .await;
    let accepted = client.until_any(&["accepted", "error"], WAIT).await;
    assert_eq!(accepted["type"], "accepted", "{accepted}");
    let reply = client.reply(WAIT).await;
    assert_eq!(reply["text"], "echo: what does this say?");

    let calls = app.runner.calls();
    assert_eq!(calls.len(), 1);
    let folder = std::path::PathBuf::from(calls[0].workspace.clone().expect("a workspace"));
    let kept: Vec<_> = std::fs::read_dir(folder.join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read(&kept[0]).unwrap(), report, "the same bytes");
    let name = kept[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("-0-Q3_report.pdf"), "{name}");
    let prompt = &calls[0].prompt;
    assert!(
        prompt.contains(&format!(
            "Attachment: attachments/{name} (application/pdf, 700 B)"
        )),
        "{prompt}"
    );
    client.close().await;
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn uploads_over_the_cap_or_the_quota_or_without_a_token_are_refused_with_the_reason() {
    let (root, root_text) = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root_text;
        c.workspace.max_attachment_bytes = 1_000;
        c.chat.upload_quota_bytes = 1_500;
    })
    .await;
    let ana = chat_token("ana", json!({}));
    let big = upload(
        &app.gateway_url,
        &ana,
        "big.bin",
        "image/png",
        vec![1; 1_001],
    )
    .await;
    assert_eq!(big.status, 413, "{big:?}");
    assert_eq!(big.body["error"]["code"], "upload_too_large");
    let reason = big.body["error"]["message"].as_str().unwrap_or("");
    assert!(reason.contains("1000 bytes"), "{reason}");

    let forged = upload(
        &app.gateway_url,
        "not-a-token",
        "a.txt",
        "text/plain",
        vec![1],
    )
    .await;
    assert_eq!(forged.status, 401, "{forged:?}");
    let empty = upload(&app.gateway_url, &ana, "a.txt", "text/plain", Vec::new()).await;
    assert_eq!(empty.status, 400, "{empty:?}");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.chat_uploads")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(stored, 0, "nothing refused is stored");

    // What one person may keep stored at once is bounded too.
    let first = upload(&app.gateway_url, &ana, "a.bin", "image/png", vec![1; 800]).await;
    assert_eq!(first.status, 201, "{first:?}");
    let second = upload(&app.gateway_url, &ana, "b.bin", "image/png", vec![2; 800]).await;
    assert_eq!(second.status, 429, "{second:?}");
    assert_eq!(second.body["error"]["code"], "upload_quota");
    let bob = chat_token("bob", json!({}));
    let other = upload(&app.gateway_url, &bob, "c.bin", "image/png", vec![3; 800]).await;
    assert_eq!(
        other.status, 201,
        "another person's quota is their own: {other:?}"
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn someone_elses_upload_cannot_be_named() {
    let (root, root_text) = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    let bob = chat_token("bob", json!({}));
    let secret = upload(
        &app.gateway_url,
        &bob,
        "payslip.pdf",
        "application/pdf",
        b"bob's payslip".to_vec(),
    )
    .await;
    assert_eq!(secret.status, 201, "{secret:?}");

    let mut ana = ChatClient::as_user(&app.gateway_url, "ana").await;
    ana.say_with_files("m-1", "show me this", &[&secret.id()])
        .await;
    let answer = ana.until_any(&["accepted", "error"], WAIT).await;
    assert_eq!(answer["type"], "error", "{answer}");
    assert_eq!(answer["code"], "unknown_upload");
    assert_eq!(answer["id"], "m-1");
    // The socket is still usable, and nothing of Bob's reached Ana's turn.
    ana.say("m-2", "hello").await;
    ana.reply(WAIT).await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 1, "the refused message opened no turn");
    assert!(!calls[0].prompt.contains("payslip"), "{}", calls[0].prompt);
    ana.close().await;
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn uploads_are_deleted_after_their_retention() {
    let (root, root_text) = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root_text;
        c.chat.upload_retention_s = 1;
    })
    .await;
    let ana = chat_token("ana", json!({}));
    let old = upload(
        &app.gateway_url,
        &ana,
        "a.txt",
        "text/plain",
        b"hi".to_vec(),
    )
    .await;
    assert_eq!(old.status, 201, "{old:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.chat_uploads")
            .fetch_one(&app.db)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "an upload past its retention is still stored"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut client = ChatClient::as_user(&app.gateway_url, "ana").await;
    client.say_with_files("m-1", "", &[&old.id()]).await;
    let answer = client.until_any(&["accepted", "error"], WAIT).await;
    assert_eq!(answer["code"], "unknown_upload", "{answer}");
    client.close().await;
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchboard_chat_send_with_a_file_uploads_it_and_names_it() {
    let (root, root_text) = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    let notes = root.with_extension("notes.txt");
    std::fs::write(&notes, b"call Dana on Monday").unwrap();
    let out = app
        .cli(&[
            "chat".as_ref(),
            "send".as_ref(),
            "--sub".as_ref(),
            "ana".as_ref(),
            "--file".as_ref(),
            notes.as_os_str(),
            "--text".as_ref(),
            "read this".as_ref(),
            "--wait".as_ref(),
            "20".as_ref(),
        ])
        .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("echo: read this"), "{stdout}");
    let calls = app.runner.calls();
    let file = notes.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        calls[0]
            .prompt
            .contains(&format!("-0-{file} (text/plain, 19 B)")),
        "{}",
        calls[0].prompt
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_file(&notes);
}

#[tokio::test]
async fn dispatch_copies_only_the_senders_own_uploads_whatever_reaches_it() {
    // A message that did not come through the gateway's check (say, a dead letter edited and
    // replayed) naming someone else's upload: dispatch does not copy it either.
    let (root, root_text) = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root_text).await;
    let bob = chat_token("bob", json!({}));
    let secret = upload(
        &app.gateway_url,
        &bob,
        "payslip.pdf",
        "application/pdf",
        b"bob's payslip".to_vec(),
    )
    .await;
    let id = uuid::Uuid::now_v7().to_string();
    let inbound = InboundMessage {
        id: id.clone(),
        channel: "admin_chat".into(),
        provider: "chat".into(),
        sender: "ana".into(),
        recipient: "admin_chat".into(),
        text: "show me this".into(),
        provider_message_id: "ana:forged-1".into(),
        received_at_ms: switchboard_kit::now_ms(),
        correlation_id: id,
        asserted: Some(Person {
            person_id: "user:ana".into(),
            person_type: "user".into(),
            ..Default::default()
        }),
        uploads: vec![secret.id()],
        ..Default::default()
    };
    let rt = Runtime::new(
        app.js.clone(),
        app.topology.clone(),
        app.config.runtime.clone(),
    );
    let out = Output::new(app.topology.inbound("admin_chat"), "forged-1", &inbound);
    rt.publish("gateway", &out).await.expect("publish inbound");
    let deadline = std::time::Instant::now() + WAIT;
    while app.runner.calls().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the turn never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let call = &app.runner.calls()[0];
    assert!(
        call.prompt
            .contains("an attachment that could not be kept (not an upload of this person's"),
        "{}",
        call.prompt
    );
    let folder = std::path::PathBuf::from(call.workspace.clone().expect("a workspace"));
    let kept = std::fs::read_dir(folder.join("attachments")).map_or(0, |d| d.count());
    assert_eq!(kept, 0, "nothing of Bob's in Ana's workspace");
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn a_retried_turn_finds_the_file_it_kept_and_does_not_read_it_again() {
    let (root, root_text) = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root_text;
        // The retry comes well after the first call, so the test can act in between.
        c.runtime.retry_base_ms = 2_000;
        c.runtime.retry_max_ms = 2_000;
    })
    .await;
    let ana = chat_token("ana", json!({}));
    let stored = upload(
        &app.gateway_url,
        &ana,
        "a.txt",
        "text/plain",
        b"hello".to_vec(),
    )
    .await;
    app.runner.fail_next(1, 500);
    let mut client = ChatClient::as_user(&app.gateway_url, "ana").await;
    client
        .say_with_files("m-1", "read it", &[&stored.id()])
        .await;
    let deadline = std::time::Instant::now() + WAIT;
    while app.runner.calls().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the turn never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The first call failed with the file kept; the stored upload goes before the retry.
    sqlx::query("DELETE FROM switchboard.chat_uploads")
        .execute(&app.db)
        .await
        .unwrap();
    client.reply(WAIT).await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2, "one failed call, one retry");
    for call in &calls {
        assert!(
            call.prompt.contains("-0-a.txt (text/plain, 5 B)"),
            "{}",
            call.prompt
        );
    }
    client.close().await;
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}
