//! Links a person proves: "link my phone +1…" in chat texts a one-time code to that number; the
//! code texted back (or typed in chat) within its lifetime records the link, with its audit
//! row. Wrong, used-up and expired codes link nothing; codes asked for are limited. A code
//! completes only the claim it was sent for, the SMS carries no words the claimant chose, and
//! codes sent are capped overall and per country prefix.
use std::time::Duration;

use serde_json::json;
use switchboard_e2e::fakes::person_of;
use switchboard_e2e::{ChatClient, FakeRunner, TestApp, chat_token, spawn_app_configured};
use switchboard_kit::config::Config;

const WAIT: Duration = Duration::from_secs(20);
const PHONE: &str = "+14155550199";
const PHONE_ID: &str = "phone:+14155550199";
const STAFF_PHONE: &str = "+14155550181";
/// A phone nobody asked a code for.
const OTHER_PHONE: &str = "+14155550177";

async fn app_with(tweak: impl FnOnce(&mut Config) + Send + 'static) -> TestApp {
    spawn_app_configured(tweak).await
}

/// Ana at the admin dashboard, her name in her token.
async fn ana(app: &TestApp) -> ChatClient {
    let token = chat_token("ana", json!({"name": "Ana Ortiz"}));
    ChatClient::connect(&app.gateway_url, &format!("token={token}"))
        .await
        .expect("the gateway accepts a valid token")
}

/// What the chat answered `text` (sent with client id `id`).
async fn ask(chat: &mut ChatClient, id: &str, text: &str) -> String {
    chat.say(id, text).await;
    chat.reply(WAIT).await["text"]
        .as_str()
        .expect("a reply has text")
        .to_string()
}

/// The six-digit code in an SMS.
fn code_in(body: &str) -> String {
    body.split(|c: char| !c.is_ascii_digit())
        .find(|w| w.len() == 6)
        .unwrap_or_else(|| panic!("no code in {body:?}"))
        .to_string()
}

/// A six-digit code that is not `code`.
fn wrong(code: &str) -> String {
    if code == "000000" { "111111" } else { "000000" }.into()
}

/// The SMS texted to the phone so far (the fake Twilio's record), `n` of them awaited.
async fn texts_to_phone(app: &TestApp, n: usize) -> Vec<String> {
    app.wait_for_sms(n, WAIT)
        .await
        .into_iter()
        .filter(|s| s.to == PHONE)
        .map(|s| s.body)
        .collect()
}

async fn links(app: &TestApp) -> Vec<(String, String)> {
    sqlx::query_as("SELECT from_person_id, to_person_id FROM switchboard.identity_links")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// The link audit's rows: who was linked to whom, by whom, why.
async fn audit(app: &TestApp) -> Vec<(String, String, String, String)> {
    sqlx::query_as(
        "SELECT from_person_id, to_person_id, actor, reason FROM switchboard.identity_link_audit",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_code_proves_only_the_number_it_was_sent_to_for_the_person_who_asked() {
    let app = app_with(|_| {}).await;
    let mut chat = ana(&app).await;
    ask(&mut chat, "m-1", &format!("link my phone {PHONE}")).await;
    let code = code_in(&texts_to_phone(&app, 1).await[0]);

    // Someone else's phone texts the right code: it proves nothing about +1…0199, and it is
    // that person's message, for the agent.
    app.send_sms(OTHER_PHONE, &code).await;
    let answered = app.wait_for_sms(2, WAIT).await;
    let to_other: Vec<_> = answered.iter().filter(|s| s.to == OTHER_PHONE).collect();
    assert_eq!(to_other.len(), 1, "{answered:?}");
    assert_eq!(
        to_other[0].body,
        format!("echo: {code}"),
        "the agent answers"
    );

    // Another chat user types it: nothing waits for a code from Carl, so it is his message.
    let token = chat_token("carl", json!({"name": "Carl"}));
    let mut carl = ChatClient::connect(&app.gateway_url, &format!("token={token}"))
        .await
        .unwrap();
    assert_eq!(ask(&mut carl, "c-1", &code).await, format!("echo: {code}"));
    carl.close().await;

    assert!(links(&app).await.is_empty(), "no link");
    assert!(audit(&app).await.is_empty(), "no audit row");
    let calls = app.runner.calls();
    let asked: Vec<(String, String)> = calls
        .iter()
        .map(|c| (person_of(&c.prompt), FakeRunner::said(&c.prompt)))
        .collect();
    assert_eq!(
        asked,
        [
            (format!("phone:{OTHER_PHONE}"), code.clone()),
            ("user:carl".to_string(), code.clone()),
        ],
        "both reach the agent as ordinary messages of those people"
    );
    app.settle().await;
    let rows = app.log_rows().await;
    for person in [format!("phone:{OTHER_PHONE}"), "user:carl".to_string()] {
        assert!(
            rows.iter()
                .any(|r| r.direction == "inbound" && r.message == code && r.person_id == person),
            "{person}'s message is in the log as theirs: {rows:?}"
        );
    }

    // The claim still waits for its number: texted from it, the same code links.
    app.send_sms(PHONE, &code).await;
    let sms = texts_to_phone(&app, 3).await;
    assert!(
        sms[1].starts_with("Linked: +14155550199 and the account that asked for the code are one"),
        "{sms:?}"
    );
    assert_eq!(links(&app).await, [(PHONE_ID.into(), "user:ana".into())]);
    assert_eq!(
        audit(&app).await,
        [(
            PHONE_ID.into(),
            "user:ana".into(),
            "user:ana".into(),
            "proved: a code sent to +14155550199 was texted back from it".into()
        )]
    );
    assert_eq!(app.runner.calls().len(), 2, "the agent is not asked");
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_phone_proved_by_the_code_texted_back_continues_the_chat_session() {
    let app = app_with(|_| {}).await;
    let mut chat = ana(&app).await;
    ask(&mut chat, "m-1", "from the dashboard").await;

    let answer = ask(&mut chat, "m-2", "link my phone +1 (415) 555-0199").await;
    assert!(answer.contains("I sent a code to +14155550199"), "{answer}");
    assert_eq!(app.runner.calls().len(), 1, "the agent is not asked");
    let sms = texts_to_phone(&app, 1).await;
    assert!(sms[0].contains("code to link this phone"), "{sms:?}");
    assert!(
        !sms[0].contains("Ana"),
        "the claimant's name is not texted: {sms:?}"
    );
    let code = code_in(&sms[0]);
    assert!(
        links(&app).await.is_empty(),
        "nothing links on the claim alone"
    );

    app.send_sms(PHONE, &code).await;
    let sms = texts_to_phone(&app, 2).await;
    assert!(
        sms[1].starts_with("Linked: +14155550199 and the account that asked for the code are one"),
        "{sms:?}"
    );
    assert_eq!(links(&app).await, [(PHONE_ID.into(), "user:ana".into())]);
    let (actor, reason): (String, String) = sqlx::query_as(
        "SELECT actor, reason FROM switchboard.identity_link_audit
          WHERE action = 'link' AND from_person_id = $1 AND to_person_id = 'user:ana'",
    )
    .bind(PHONE_ID)
    .fetch_one(&app.db)
    .await
    .expect("the link has its audit row");
    assert_eq!(actor, "user:ana");
    assert_eq!(
        reason,
        "proved: a code sent to +14155550199 was texted back from it"
    );

    // The phone is Ana now: her session, her engine session resumed.
    app.send_sms(PHONE, "on my way, from my phone").await;
    texts_to_phone(&app, 3).await;
    let calls = app.runner.calls();
    assert_eq!(
        calls.len(),
        2,
        "only the people's own messages reach the agent"
    );
    assert_eq!(
        FakeRunner::said(&calls[1].prompt),
        "on my way, from my phone"
    );
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));

    // Both sides of the exchange are in the log, in Ana's session.
    app.settle().await;
    let rows = app.log_rows().await;
    let logged = |direction: &str, text: &str| {
        rows.iter()
            .any(|r| r.direction == direction && r.message.starts_with(text))
    };
    assert!(logged("inbound", "link my phone +1 (415) 555-0199"));
    assert!(logged("outbound", "I sent a code to +14155550199"));
    assert!(logged("inbound", &code));
    assert!(logged("outbound", "Linked: +14155550199"));
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_code_typed_in_chat_makes_the_chat_user_the_staff_member_whose_phone_it_is() {
    let app = app_with(|_| {}).await;
    let out = app
        .cli(&[
            "directory".as_ref(),
            "add".as_ref(),
            "--id".as_ref(),
            "staff-7".as_ref(),
            "--type".as_ref(),
            "staff".as_ref(),
            "--name".as_ref(),
            "Dana Reyes".as_ref(),
            "--phone".as_ref(),
            STAFF_PHONE.as_ref(),
        ])
        .await;
    assert!(out.status.success(), "{out:?}");
    let token = chat_token("dana", json!({"name": "Dana"}));
    let mut chat = ChatClient::connect(&app.gateway_url, &format!("token={token}"))
        .await
        .unwrap();
    let answer = ask(&mut chat, "m-1", "link my phone 415 555 0181").await;
    assert!(answer.contains("I sent a code to +14155550181"), "{answer}");
    let sms = app.wait_for_sms(1, WAIT).await;
    assert_eq!(sms[0].to, STAFF_PHONE);
    let code = code_in(&sms[0].body);

    let answer = ask(&mut chat, "m-2", &format!("code {code}")).await;
    assert!(
        answer.starts_with("Linked: +14155550181 and Dana"),
        "{answer}"
    );
    assert_eq!(links(&app).await, [("user:dana".into(), "staff-7".into())]);

    ask(&mut chat, "m-3", "which ward am I on today?").await;
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0].prompt.contains("Dana Reyes"),
        "the agent is told she is the staff member: {}",
        calls[0].prompt
    );
    app.settle().await;
    let row = app
        .log_rows()
        .await
        .into_iter()
        .find(|r| r.message == "which ward am I on today?")
        .unwrap();
    assert_eq!(row.person_id, "staff-7");
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn wrong_codes_link_nothing_and_the_last_wrong_try_ends_the_claim() {
    let app = app_with(|c| c.identity.proof.max_wrong_codes = 1).await;
    let mut chat = ana(&app).await;
    ask(&mut chat, "m-1", &format!("link my phone {PHONE}")).await;
    let code = code_in(&texts_to_phone(&app, 1).await[0]);

    app.send_sms(PHONE, &wrong(&code)).await;
    let sms = texts_to_phone(&app, 2).await;
    assert_eq!(
        sms[1],
        "That code is not right. 1 more try before it stops working."
    );
    app.send_sms(PHONE, &wrong(&code)).await;
    let sms = texts_to_phone(&app, 3).await;
    assert!(sms[2].contains("that was the last try"), "{sms:?}");

    // The right code is too late: the claim is over, and six digits are just a message.
    app.send_sms(PHONE, &code).await;
    texts_to_phone(&app, 4).await;
    assert!(links(&app).await.is_empty());
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(FakeRunner::said(&calls[0].prompt), code);
    assert!(
        app.metrics()
            .await
            .contains("sb_identity_link_proofs_total{outcome=\"used_up\"} 1")
    );
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn an_expired_code_links_nothing() {
    let app = app_with(|c| c.identity.proof.code_ttl_s = 1).await;
    let mut chat = ana(&app).await;
    let answer = ask(&mut chat, "m-1", &format!("link my phone {PHONE}")).await;
    assert!(answer.contains("within a second"), "{answer}");
    let code = code_in(&texts_to_phone(&app, 1).await[0]);
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let answer = ask(&mut chat, "m-2", &code).await;
    assert_eq!(
        answer,
        "That code has expired. Ask for a new one: link my phone +14155550199"
    );
    assert!(links(&app).await.is_empty());
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn codes_are_limited_per_hour_and_a_number_someone_else_holds_is_not_linked_by_code() {
    let app = app_with(|c| c.identity.proof.codes_per_hour = 2).await;
    let mut chat = ana(&app).await;
    for (i, id) in ["m-1", "m-2"].into_iter().enumerate() {
        let answer = ask(&mut chat, id, &format!("link my phone {PHONE}")).await;
        assert!(answer.starts_with("I sent a code"), "{answer}");
        texts_to_phone(&app, i + 1).await;
    }
    let answer = ask(&mut chat, "m-3", &format!("link my phone {PHONE}")).await;
    assert_eq!(
        answer,
        "Too many codes were asked for in the last hour. Try again later."
    );
    // The number is limited too, whoever asks: nobody can have it texted over and over.
    let token = chat_token("carl", json!({}));
    let mut carl = ChatClient::connect(&app.gateway_url, &format!("token={token}"))
        .await
        .unwrap();
    let answer = ask(&mut carl, "c-1", &format!("link my phone {PHONE}")).await;
    assert_eq!(
        answer,
        "Too many codes were asked for in the last hour. Try again later."
    );
    carl.close().await;
    // Only the newest code counts: asking again replaced the first.
    let sms = texts_to_phone(&app, 2).await;
    let (mut first, second) = (code_in(&sms[0]), code_in(&sms[1]));
    if first == second {
        // One time in a million the new code is the old one: then the first claim is given
        // another code, so that typing it always tests that the replaced claim is over.
        first = wrong(&second);
        let changed = sqlx::query(
            "UPDATE switchboard.link_claims SET code = $1
              WHERE id = (SELECT id FROM switchboard.link_claims
                           WHERE claimant_id = 'user:ana' ORDER BY created_at LIMIT 1)",
        )
        .bind(&first)
        .execute(&app.db)
        .await
        .unwrap();
        assert_eq!(changed.rows_affected(), 1);
    }
    assert_ne!(first, second);
    let answer = ask(&mut chat, "m-4", &first).await;
    assert!(answer.starts_with("That code is not right"), "{answer}");
    let answer = ask(&mut chat, "m-5", &second).await;
    assert!(answer.starts_with("Linked"), "{answer}");

    // Bo is in the directory as staff-8; the number is Ana's now.
    for args in [
        &["directory", "add", "--id", "staff-8", "--type", "staff"][..],
        &[
            "people",
            "link",
            "user:bo",
            "staff-8",
            "--reason",
            "Bo's login",
        ][..],
    ] {
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        assert!(app.cli(&args).await.status.success());
    }
    let token = chat_token("bo", json!({}));
    let mut bo = ChatClient::connect(&app.gateway_url, &format!("token={token}"))
        .await
        .unwrap();
    let answer = ask(&mut bo, "b-1", &format!("link my phone {PHONE}")).await;
    assert!(
        answer.starts_with("+14155550199 belongs to someone else here"),
        "{answer}"
    );
    let bo_claims: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.link_claims WHERE claimant_id = 'staff-8'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(bo_claims, 0, "no code was sent");
    assert!(app.runner.calls().is_empty());
    bo.close().await;
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_request_handled_twice_sends_one_code_and_answers_the_same() {
    use switchboard_identify::{IdentifyStage, IdentityResolver, links::IdentityLinks, proof};
    use switchboard_kit::proto::{InboundMessage, Person};
    use switchboard_kit::{Attempt, Stage as _};

    let app = app_with(|_| {}).await;
    let config = &app.config;
    let stage = IdentifyStage::new(
        IdentityResolver::new(app.db.clone(), config.identity.clone()),
        Some(proof::LinkProofs::new(
            app.db.clone(),
            IdentityLinks::new(app.db.clone(), config.identity.clone()),
            config.identity.proof.clone(),
            config.identity.default_region.clone(),
            config.proof_sms_sender(),
        )),
        app.topology.clone(),
    );
    let asked = InboundMessage {
        id: uuid::Uuid::now_v7().to_string(),
        channel: "admin_chat".into(),
        provider: "chat".into(),
        sender: "ana".into(),
        text: format!("link my phone {PHONE}"),
        correlation_id: "c-1".into(),
        asserted: Some(Person {
            person_id: "user:ana".into(),
            person_type: "user".into(),
            name: "Ana Ortiz".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let attempt = |delivered| Attempt {
        subject: app.topology.inbound("admin_chat"),
        delivered,
        stream_sequence: 1,
        correlation_id: "c-1".into(),
        waits: 0,
        waited: Duration::ZERO,
    };
    // As after a crash between the handler and the ack: the same message, delivered again.
    let first = stage.handle(asked.clone(), &attempt(1)).await.unwrap();
    let again = stage.handle(asked, &attempt(2)).await.unwrap();
    let published = |out: &[switchboard_kit::Output]| {
        out.iter()
            .map(|o| (o.subject.clone(), o.dedupe_id.clone(), o.payload.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(published(&first), published(&again));
    let code_messages: Vec<_> = first
        .iter()
        .filter(|o| o.subject == app.topology.inbound("sms"))
        .collect();
    assert_eq!(code_messages.len(), 1, "one code message, to the phone");
    let claims: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.link_claims")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(claims, 1);
    app.shutdown().await;
}

/// A chat user named `name` in their token (the name is theirs to choose).
async fn chat_user(app: &TestApp, sub: &str, name: &str) -> ChatClient {
    let token = chat_token(sub, json!({ "name": name }));
    ChatClient::connect(&app.gateway_url, &format!("token={token}"))
        .await
        .expect("the gateway accepts a valid token")
}

#[tokio::test]
async fn a_code_completes_only_the_claim_it_was_sent_for() {
    let app = app_with(|c| c.identity.proof.codes_per_hour = 5).await;
    let mut chat = ana(&app).await;
    ask(&mut chat, "m-1", &format!("link my phone {PHONE}")).await;
    let code = code_in(&texts_to_phone(&app, 1).await[0]);

    // Mallory, calling herself Ana too, asks for Ana's number while Ana's code works: no code
    // is sent for her, so the phone's holder never has two people's codes to tell apart.
    let mut mallory = chat_user(&app, "mallory", "Ana Ortiz").await;
    let answer = ask(&mut mallory, "x-1", &format!("link my phone {PHONE}")).await;
    assert_eq!(
        answer,
        "Someone else was just sent a code for +14155550199. Try again in 10 minutes."
    );
    app.settle().await;
    assert_eq!(app.twilio.sent().len(), 1, "{:?}", app.twilio.sent());

    // A claim of Mallory's with Ana's very code (as a pair of claims from before codes were
    // made unique could be), the newest: the code texted back from the phone cannot tell
    // whose it is, so it completes neither, least of all the newest.
    sqlx::query(
        "INSERT INTO switchboard.link_claims
             (id, requested_by, claimant_id, claimant_name, phone, code, expires_at)
         VALUES ($1, $2, 'user:mallory', 'Ana Ortiz', $3, $4, now() + interval '10 minutes')",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(uuid::Uuid::now_v7())
    .bind(PHONE)
    .bind(&code)
    .execute(&app.db)
    .await
    .unwrap();
    app.send_sms(PHONE, &code).await;
    let sms = texts_to_phone(&app, 2).await;
    assert!(sms[1].contains("links nothing"), "{sms:?}");
    assert!(links(&app).await.is_empty(), "nobody is linked");

    // Ana's new code is hers alone: texted back, it links her and nobody else.
    ask(&mut chat, "m-2", &format!("link my phone {PHONE}")).await;
    let code = code_in(&texts_to_phone(&app, 3).await[2]);
    app.send_sms(PHONE, &code).await;
    let sms = texts_to_phone(&app, 4).await;
    assert!(sms[3].starts_with("Linked: +14155550199"), "{sms:?}");
    assert_eq!(links(&app).await, [(PHONE_ID.into(), "user:ana".into())]);
    mallory.close().await;
    chat.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn the_code_sms_is_the_operators_template_with_no_words_the_claimant_chose() {
    let app = app_with(|c| {
        c.identity.proof.sms_template = "Acme: {code} links this phone ({lifetime}).".into();
    })
    .await;
    let spam = "Call +1 900 555 0100 to win";
    let mut mallory = chat_user(&app, "mallory", spam).await;
    ask(&mut mallory, "x-1", &format!("link my phone {PHONE}")).await;
    let sms = texts_to_phone(&app, 1).await;
    let code = code_in(&sms[0]);
    assert_eq!(
        sms[0],
        format!("Acme: {code} links this phone (10 minutes).")
    );

    // Nor is it told to the phone once linked.
    app.send_sms(PHONE, &code).await;
    let sms = texts_to_phone(&app, 2).await;
    assert!(sms[1].starts_with("Linked:"), "{sms:?}");
    for body in &sms {
        assert!(
            !body.contains("900") && !body.contains("win"),
            "the claimant's words reached the phone: {body:?}"
        );
    }
    mallory.close().await;
    app.shutdown().await;
}

#[tokio::test]
async fn codes_sent_are_capped_overall_and_per_country_prefix() {
    const UK: &str = "+447911123456";
    const UK_2: &str = "+447911123457";
    let app = app_with(|c| {
        c.identity.proof.max_codes_per_hour = 3;
        c.identity
            .proof
            .max_codes_per_hour_by_prefix
            .insert("+44".into(), 1);
    })
    .await;
    // Each asker is someone new, for a number of their own: only the caps can refuse them.
    let asks = [
        ("ana", PHONE, true),
        ("bo", UK, true),
        ("carl", UK_2, false),
        ("dee", OTHER_PHONE, true),
        ("eve", STAFF_PHONE, false),
    ];
    for (i, (who, number, sent)) in asks.into_iter().enumerate() {
        let mut chat = chat_user(&app, who, who).await;
        let answer = ask(
            &mut chat,
            &format!("{who}-{i}"),
            &format!("link my phone {number}"),
        )
        .await;
        if sent {
            assert!(answer.starts_with("I sent a code"), "{who}: {answer}");
        } else {
            assert_eq!(
                answer, "Too many codes are being sent right now. Try again later.",
                "{who}"
            );
        }
        chat.close().await;
    }
    app.settle().await;
    let sent: Vec<String> = app.twilio.sent().into_iter().map(|s| s.to).collect();
    assert_eq!(sent.len(), 3, "nothing is sent over a cap: {sent:?}");
    assert!(!sent.contains(&UK_2.to_string()) && !sent.contains(&STAFF_PHONE.to_string()));
    let metrics = app.metrics().await;
    for line in [
        "sb_identity_link_proofs_total{outcome=\"codes_capped\"} 2",
        "sb_identity_link_codes_capped_total{cap=\"prefix\"} 1",
        "sb_identity_link_codes_capped_total{cap=\"global\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    app.shutdown().await;
}
