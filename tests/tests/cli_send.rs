//! `switchboard send`, as a newcomer tries the product: one message through each channel,
//! sent exactly as that channel's client sends it, and the agent's reply printed.
use std::ffi::OsStr;

use serde_json::Value;
use switchboard_channels::slack::SlackSettings;
use switchboard_channels::telegram::TelegramSettings;
use switchboard_channels::whatsapp::WhatsAppSettings;
use switchboard_e2e::{TestApp, spawn_app_configured};

async fn send(app: &TestApp, args: &[&str]) -> Value {
    let mut all = vec!["send"];
    all.extend_from_slice(args);
    all.push("--json");
    app.cli_json(&all).await
}

#[tokio::test]
async fn a_person_trying_it_gets_an_answer_on_every_channel_from_the_cli() {
    // The demo's provider outboxes stand in for Twilio's and TextMagic's send APIs, as in
    // `make run`, so the CLI can read the SMS replies back.
    let app = spawn_app_configured(|c| {
        c.demo.enabled = true;
        c.twilio.api_base = format!("{}/demo/twilio", c.gateway.public_url);
        c.textmagic.api_base = format!("{}/demo/textmagic", c.gateway.public_url);
        let mut telegram: TelegramSettings = c.provider_settings("telegram").unwrap();
        telegram.api_base = format!("{}/demo/telegram", c.gateway.public_url);
        c.set_provider_settings("telegram", &telegram).unwrap();
        let mut slack: SlackSettings = c.provider_settings("slack").unwrap();
        slack.api_base = format!("{}/demo/slack", c.gateway.public_url);
        slack.files_base = slack.api_base.clone();
        c.set_provider_settings("slack", &slack).unwrap();
        let mut whatsapp: WhatsAppSettings = c.provider_settings("whatsapp").unwrap();
        whatsapp.api_base = format!("{}/demo/whatsapp", c.gateway.public_url);
        c.set_provider_settings("whatsapp", &whatsapp).unwrap();
    })
    .await;
    let sms = send(&app, &["hello by sms", "--from", "+1 415 555 0177"]).await;
    assert_eq!(sms["channel"], "sms");
    assert_eq!(sms["from"], "+14155550177");
    assert_eq!(sms["replies"], serde_json::json!(["echo: hello by sms"]));

    let tm = send(
        &app,
        &[
            "hello by textmagic",
            "--channel",
            "textmagic",
            "--from",
            "+14155550177",
        ],
    )
    .await;
    assert_eq!(
        tm["replies"],
        serde_json::json!(["echo: hello by textmagic"])
    );
    // Same person, same conversation: the second turn resumed the first's engine session.
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    assert!(calls[1].session_id.is_some(), "{:?}", calls[1]);

    let chat = send(
        &app,
        &["hello by chat", "--channel", "chat", "--from", "ana"],
    )
    .await;
    assert_eq!(chat["from"], "user:ana");
    assert_eq!(chat["replies"], serde_json::json!(["echo: hello by chat"]));

    let key = app.api_key("crm", &[]).await;
    let api = send(&app, &["order 1234?", "--channel", "api", "--key", &key]).await;
    assert_eq!(api["replies"], serde_json::json!(["echo: order 1234?"]));

    // A Telegram user: the bot's webhook pointed at this gateway, then a private message.
    let set = app.cli_ok(&["telegram", "set-webhook"]).await;
    assert!(
        set.contains(&format!(
            "webhook set to {}/webhooks/telegram",
            app.gateway_url
        )),
        "{set}"
    );
    let tg = send(
        &app,
        &[
            "hello by telegram",
            "--channel",
            "telegram",
            "--from",
            "424242",
        ],
    )
    .await;
    assert_eq!(tg["from"], "telegram:424242");
    assert_eq!(
        tg["replies"],
        serde_json::json!(["echo: hello by telegram"])
    );

    // A Slack user writing to the app directly.
    let sl = send(
        &app,
        &[
            "hello by slack",
            "--channel",
            "slack",
            "--from",
            "U0ANA0001",
        ],
    )
    .await;
    assert_eq!(sl["from"], "slack:T0DEMO001:U0ANA0001");
    assert_eq!(sl["replies"], serde_json::json!(["echo: hello by slack"]));

    // A WhatsApp message to the business number.
    let wa = send(
        &app,
        &[
            "hello by whatsapp",
            "--channel",
            "whatsapp",
            "--from",
            "+1 650 555 0199",
        ],
    )
    .await;
    assert_eq!(wa["from"], "whatsapp:+16505550199");
    assert_eq!(
        wa["replies"],
        serde_json::json!(["echo: hello by whatsapp"])
    );

    // `sms send`, the provider-faithful form, for a script too.
    let sms = app
        .cli_json(&[
            "sms",
            "send",
            "--from",
            "+14155550178",
            "--text",
            "hello again",
            "--json",
        ])
        .await;
    assert_eq!(sms["from"], "+14155550178");
    assert_eq!(sms["replies"][0]["body"], "echo: hello again", "{sms}");

    // Without a key the API channel says how to get one.
    let out = app
        .cli(&[
            OsStr::new("send"),
            OsStr::new("hi"),
            OsStr::new("--channel"),
            OsStr::new("api"),
        ])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("api-keys create"),
        "{out:?}"
    );
    app.shutdown().await;
}
