//! Identity links as data: an operator links, unlinks or merges two person ids, by the CLI or
//! the API, with an audit trail of who, when and why; linked ids share one session under the
//! default (person) scope.
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_e2e::{ChatClient, FakeRunner, TestApp, spawn_app};

const WAIT: Duration = Duration::from_secs(20);
const STAFF_PHONE: &str = "+14155550181";
const NEW_PHONE: &str = "+14155550199";
const NEW_PHONE_ID: &str = "phone:+14155550199";

/// `switchboard <args>` as an operator runs it: (exit code, stdout, stderr).
async fn cli(app: &TestApp, args: &[&str]) -> (Option<i32>, String, String) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let out = app.cli(&args).await;
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `switchboard <args>` that must succeed; its stdout.
async fn ok(app: &TestApp, args: &[&str]) -> String {
    let (code, out, err) = cli(app, args).await;
    assert_eq!(code, Some(0), "{args:?} failed:\n{out}\n{err}");
    out
}

/// Dana, a staff member the directory knows by her phone.
async fn staff_member(app: &TestApp) {
    ok(
        app,
        &[
            "directory",
            "add",
            "--id",
            "staff-7",
            "--type",
            "staff",
            "--name",
            "Dana Reyes",
            "--role",
            "nurse",
            "--phone",
            STAFF_PHONE,
        ],
    )
    .await;
}

/// An SMS from `from`, answered (the `n`th reply sent).
async fn text(app: &TestApp, from: &str, body: &str, n: usize) {
    app.send_sms(from, body).await;
    app.wait_for_sms(n, WAIT).await;
}

async fn sessions(app: &TestApp) -> Vec<(String, String)> {
    sqlx::query_as("SELECT person_id, scope_key FROM switchboard.sessions ORDER BY created_at")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// The person and session the inbound message `text` was logged under.
async fn logged_as(app: &TestApp, text: &str) -> (String, uuid::Uuid) {
    app.settle().await;
    let row = app
        .log_rows()
        .await
        .into_iter()
        .find(|r| r.direction == "inbound" && r.message == text)
        .unwrap_or_else(|| panic!("{text:?} was not logged"));
    (row.person_id, row.session_id)
}

async fn audit_rows(app: &TestApp) -> Vec<(String, String, String, String, String)> {
    sqlx::query_as(
        "SELECT action, from_person_id, to_person_id, actor, reason
           FROM switchboard.identity_link_audit ORDER BY at DESC, id DESC",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_phone_linked_to_a_staff_member_continues_her_session_and_the_audit_says_who_when_why() {
    let app = spawn_app().await;
    staff_member(&app).await;
    text(&app, STAFF_PHONE, "shift starts at 7", 1).await;
    // A number nobody knows yet: its own, external person.
    text(&app, NEW_PHONE, "it's me on my new phone", 2).await;
    assert_eq!(
        logged_as(&app, "it's me on my new phone").await.0,
        NEW_PHONE_ID
    );

    let before = chrono::Utc::now();
    let out = ok(
        &app,
        &[
            "people",
            "link",
            "phone:+1 415-555-0199",
            "staff-7",
            "--reason",
            "Dana's new work phone",
            "--by",
            "ops-lee",
        ],
    )
    .await;
    let after = chrono::Utc::now();
    assert!(out.contains("linked phone:+14155550199 → staff-7"), "{out}");

    text(&app, NEW_PHONE, "running late", 3).await;
    let calls = app.runner.calls();
    assert_eq!(FakeRunner::said(&calls[2].prompt), "running late");
    // The staff member's engine session, resumed; the agent is told who she is.
    assert_eq!(calls[2].session_id.as_deref(), Some("eng-1"));
    assert!(
        calls[2].prompt.contains("Dana Reyes"),
        "{}",
        calls[2].prompt
    );
    let (person, session) = logged_as(&app, "running late").await;
    assert_eq!(person, "staff-7");
    assert_eq!(session, logged_as(&app, "shift starts at 7").await.1);
    assert_eq!(
        sessions(&app).await,
        [
            ("staff-7".into(), "reggie_oc:person:staff:staff-7".into()),
            (
                NEW_PHONE_ID.into(),
                "reggie_oc:person:external:phone:+14155550199".into()
            ),
        ]
    );
    // The reply went to the phone that wrote.
    assert_eq!(app.twilio.sent()[2].to, NEW_PHONE);

    // Who, when, why.
    let listing = ok(&app, &["people", "links", "--person", "staff-7"]).await;
    assert!(
        listing.contains("phone:+14155550199 → staff-7"),
        "{listing}"
    );
    assert!(
        listing.contains("by ops-lee: Dana's new work phone"),
        "{listing}"
    );
    let (actor, reason, at): (String, String, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT actor, reason, at FROM switchboard.identity_link_audit")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        (actor.as_str(), reason.as_str()),
        ("ops-lee", "Dana's new work phone")
    );
    assert!(before <= at && at <= after, "{before} <= {at} <= {after}");

    // Linking again changes nothing and records nothing.
    let again = ok(
        &app,
        &[
            "people",
            "link",
            NEW_PHONE_ID,
            "staff-7",
            "--reason",
            "again",
        ],
    )
    .await;
    assert!(again.contains("nothing changed"), "{again}");
    assert_eq!(audit_rows(&app).await.len(), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_chain_of_links_is_followed_to_its_end_phone_to_chat_login_to_staff_member() {
    let app = spawn_app().await;
    staff_member(&app).await;
    text(&app, STAFF_PHONE, "shift starts at 7", 1).await;
    // Two links made separately: the chat login is Dana's, then a phone is the chat login's.
    ok(
        &app,
        &[
            "people",
            "link",
            "user:ana",
            "staff-7",
            "--reason",
            "ana is Dana's dashboard login",
        ],
    )
    .await;
    ok(
        &app,
        &[
            "people",
            "link",
            NEW_PHONE_ID,
            "user:ana",
            "--reason",
            "ana's phone",
        ],
    )
    .await;

    text(&app, NEW_PHONE, "two links away", 2).await;
    let calls = app.runner.calls();
    assert_eq!(FakeRunner::said(&calls[1].prompt), "two links away");
    // Dana's engine session, resumed, and the agent is told it is Dana: not ana's, not the
    // phone's own.
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    assert!(
        calls[1].prompt.contains("Dana Reyes"),
        "{}",
        calls[1].prompt
    );
    let (person, session) = logged_as(&app, "two links away").await;
    assert_eq!(person, "staff-7");
    assert_eq!(session, logged_as(&app, "shift starts at 7").await.1);
    assert_eq!(
        sessions(&app).await,
        [("staff-7".into(), "reggie_oc:person:staff:staff-7".into())]
    );
    // The reply went to the phone that wrote.
    assert_eq!(app.twilio.sent()[1].to, NEW_PHONE);
    app.shutdown().await;
}

#[tokio::test]
async fn after_unlink_the_phone_is_its_own_person_again_in_a_new_session() {
    let app = spawn_app().await;
    staff_member(&app).await;
    text(&app, STAFF_PHONE, "hello", 1).await;
    ok(
        &app,
        &[
            "people",
            "link",
            NEW_PHONE_ID,
            "staff-7",
            "--reason",
            "Dana's spare",
        ],
    )
    .await;
    text(&app, NEW_PHONE, "from the spare", 2).await;
    assert_eq!(logged_as(&app, "from the spare").await.0, "staff-7");

    let out = ok(
        &app,
        &[
            "people",
            "unlink",
            NEW_PHONE_ID,
            "staff-7",
            "--reason",
            "spare phone returned",
        ],
    )
    .await;
    assert!(
        out.contains("unlinked phone:+14155550199 → staff-7"),
        "{out}"
    );
    text(&app, NEW_PHONE, "who is this?", 3).await;
    let calls = app.runner.calls();
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    assert_eq!(calls[2].session_id, None, "a new session, not Dana's");
    assert!(
        !calls[2].prompt.contains("Dana Reyes"),
        "{}",
        calls[2].prompt
    );
    assert_eq!(logged_as(&app, "who is this?").await.0, NEW_PHONE_ID);
    assert_eq!(sessions(&app).await.len(), 2);

    // Both actions, newest first; without --by the OS user is who did it.
    let audit = audit_rows(&app).await;
    let actions: Vec<_> = audit.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(actions, ["unlink", "link"]);
    // The CLI ran with this process's environment, so the product's rule gives the same name.
    assert_eq!(audit[0].3, switchboard::os_user());
    assert_eq!(audit[0].4, "spare phone returned");
    app.shutdown().await;
}

#[tokio::test]
async fn a_merge_moves_the_phone_to_the_other_person_and_outlives_the_link() {
    let app = spawn_app().await;
    staff_member(&app).await;
    text(&app, STAFF_PHONE, "hello", 1).await;
    let out = ok(
        &app,
        &[
            "people",
            "merge",
            NEW_PHONE_ID,
            "staff-7",
            "--reason",
            "same person",
            "--by",
            "ops-lee",
        ],
    )
    .await;
    assert!(out.contains("merged phone:+14155550199 → staff-7"), "{out}");
    let owner: String = sqlx::query_scalar(
        "SELECT person_id FROM switchboard.contact_points WHERE kind = 'phone' AND address = $1",
    )
    .bind(NEW_PHONE)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(owner, "staff-7");
    let audit = audit_rows(&app).await;
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].0, "merge");
    let moved: Vec<String> =
        sqlx::query_scalar("SELECT unnest(moved) FROM switchboard.identity_link_audit")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(moved, ["phone:+14155550199"]);

    // The contact point moved: with the merge's link undone, the phone is still Dana's.
    let out = ok(
        &app,
        &[
            "people",
            "unlink",
            NEW_PHONE_ID,
            "staff-7",
            "--reason",
            "link no longer needed",
        ],
    )
    .await;
    assert!(
        out.contains("unlinked phone:+14155550199 → staff-7"),
        "{out}"
    );
    let listing = ok(&app, &["people", "links"]).await;
    assert!(listing.contains("links (0):"), "{listing}");
    text(&app, NEW_PHONE, "from my other phone", 2).await;
    assert_eq!(app.runner.calls()[1].session_id.as_deref(), Some("eng-1"));
    assert_eq!(logged_as(&app, "from my other phone").await.0, "staff-7");
    assert_eq!(sessions(&app).await.len(), 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_phone_linked_to_a_chat_user_the_directory_does_not_know_shares_her_session() {
    let app = spawn_app().await;
    let mut chat = ChatClient::as_user(&app.gateway_url, "ana").await;
    chat.say("m-1", "from the dashboard").await;
    chat.reply(WAIT).await;
    ok(
        &app,
        &[
            "people",
            "link",
            NEW_PHONE_ID,
            "user:ana",
            "--reason",
            "Ana's phone",
        ],
    )
    .await;
    text(&app, NEW_PHONE, "from my phone", 1).await;
    assert_eq!(app.runner.calls()[1].session_id.as_deref(), Some("eng-1"));
    assert_eq!(
        sessions(&app).await,
        [("user:ana".into(), "reggie_oc:person:user:user:ana".into())]
    );
    chat.close().await;
    app.shutdown().await;
}

async fn api(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{}{path}", app.gateway_url))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let resp = request.send().await.expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn over_the_api_a_key_with_identity_write_links_lists_unlinks_and_merges() {
    let app = spawn_app().await;
    staff_member(&app).await;
    let writer = app.api_key("ops-console", &["identity:write"]).await;
    let reader = app.api_key("auditor", &["identity:read"]).await;
    // A key made with the default scopes: messages only.
    let plain = app.api_key("crm", &[]).await;
    let link = json!({"from": NEW_PHONE_ID, "to": "staff-7", "reason": "Dana's new work phone"});
    let post = reqwest::Method::POST;

    let (status, body) = api(
        &app,
        post.clone(),
        "/api/v1/identity/links",
        &plain,
        Some(link.clone()),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (403, &json!("missing_scope"))
    );
    let (status, _) = api(
        &app,
        post.clone(),
        "/api/v1/identity/links",
        &reader,
        Some(link.clone()),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = api(
        &app,
        reqwest::Method::GET,
        "/api/v1/identity/links",
        &plain,
        None,
    )
    .await;
    assert_eq!(status, 403);
    assert!(audit_rows(&app).await.is_empty());

    let (status, body) = api(
        &app,
        post.clone(),
        "/api/v1/identity/links",
        &writer,
        Some(link.clone()),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["audit"]["actor"], "api:ops-console");
    let (status, body) = api(&app, post, "/api/v1/identity/links", &writer, Some(link)).await;
    assert_eq!((status, &body["status"]), (200, &json!("unchanged")));

    let (status, listing) = api(
        &app,
        reqwest::Method::GET,
        "/api/v1/identity/links?person=staff-7",
        &reader,
        None,
    )
    .await;
    assert_eq!(status, 200, "{listing}");
    assert_eq!(listing["links"].as_array().unwrap().len(), 1, "{listing}");
    assert_eq!(listing["links"][0]["from"], NEW_PHONE_ID);
    assert_eq!(listing["links"][0]["to"], "staff-7");
    assert_eq!(listing["links"][0]["by"], "api:ops-console");
    assert_eq!(listing["audit"][0]["action"], "link");
    assert_eq!(listing["audit"][0]["reason"], "Dana's new work phone");
    assert!(listing["audit"][0]["at"].as_str().is_some(), "{listing}");

    let unlink = "/api/v1/identity/links/phone:%2B14155550199/staff-7?reason=phone+returned";
    let (status, body) = api(&app, reqwest::Method::DELETE, unlink, &writer, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["audit"]["action"], "unlink");
    let (status, body) = api(&app, reqwest::Method::DELETE, unlink, &writer, None).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("not_linked"))
    );

    let (_, listing) = api(
        &app,
        reqwest::Method::GET,
        "/api/v1/identity/links",
        &writer,
        None,
    )
    .await;
    assert_eq!(listing["links"], json!([]));
    let actions: Vec<_> = listing["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].clone())
        .collect();
    assert_eq!(actions, [json!("unlink"), json!("link")]);
    assert_eq!(listing["audit"][0]["reason"], "phone returned");

    // A merge: the phone becomes Dana's in the directory itself.
    let merge = json!({"from": NEW_PHONE_ID, "to": "staff-7", "reason": "one person"});
    let (status, body) = api(
        &app,
        reqwest::Method::POST,
        "/api/v1/identity/merges",
        &writer,
        Some(merge.clone()),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["audit"]["action"], "merge");
    assert_eq!(body["audit"]["moved"], json!(["phone:+14155550199"]));
    let (status, body) = api(
        &app,
        reqwest::Method::POST,
        "/api/v1/identity/merges",
        &plain,
        Some(merge),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (403, &json!("missing_scope"))
    );
    app.shutdown().await;
}

#[tokio::test]
async fn self_links_cycles_and_unknown_links_are_refused_with_the_reason() {
    let app = spawn_app().await;
    staff_member(&app).await;
    ok(
        &app,
        &[
            "people",
            "link",
            NEW_PHONE_ID,
            "staff-7",
            "--reason",
            "Dana's phone",
        ],
    )
    .await;

    async fn refused(app: &TestApp, args: &[&str]) -> String {
        let (code, out, err) = cli(app, args).await;
        assert_eq!(code, Some(1), "{args:?} was not refused:\n{out}\n{err}");
        err
    }
    let err = refused(
        &app,
        &["people", "link", "staff-7", "staff-7", "--reason", "x"],
    )
    .await;
    assert!(err.contains("staff-7 cannot be linked to itself"), "{err}");
    let err = refused(
        &app,
        &["people", "link", "staff-7", NEW_PHONE_ID, "--reason", "x"],
    )
    .await;
    assert!(err.contains("would make a cycle"), "{err}");
    let err = refused(
        &app,
        &["people", "unlink", "user:ana", "staff-7", "--reason", "x"],
    )
    .await;
    assert!(err.contains("user:ana is not linked to staff-7"), "{err}");
    // A mistyped id would send someone's messages to no one.
    let err = refused(
        &app,
        &["people", "link", "user:ana", "staf-7", "--reason", "x"],
    )
    .await;
    assert!(err.contains("\"staf-7\" is no person"), "{err}");
    let err = refused(
        &app,
        &["people", "link", "user:ana", "staff-7", "--reason", " "],
    )
    .await;
    assert!(err.contains("a reason is required"), "{err}");

    let key = app.api_key("ops-console", &["identity:write"]).await;
    let post = |body: Value| {
        api(
            &app,
            reqwest::Method::POST,
            "/api/v1/identity/links",
            &key,
            Some(body),
        )
    };
    let (status, body) = post(json!({"from": "staff-7", "to": "staff-7", "reason": "x"})).await;
    assert_eq!((status, &body["error"]["code"]), (400, &json!("self_link")));
    let (status, body) = post(json!({"from": "staff-7", "to": NEW_PHONE_ID, "reason": "x"})).await;
    assert_eq!((status, &body["error"]["code"]), (400, &json!("cycle")));
    assert!(
        body["error"]["message"].as_str().unwrap().contains("cycle"),
        "{body}"
    );
    let (status, body) = post(json!({"from": "user:ana", "to": "staff-7"})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("missing_field"))
    );
    let (status, body) = api(
        &app,
        reqwest::Method::DELETE,
        "/api/v1/identity/links/user:ana/staff-7?reason=x",
        &key,
        None,
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("not_linked"))
    );

    // Nothing refused was recorded or changed.
    assert_eq!(audit_rows(&app).await.len(), 1);
    let links: i64 = sqlx::query_scalar("SELECT count(*) FROM switchboard.identity_links")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(links, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn two_operators_linking_two_ids_to_each_other_at_once_make_one_link_not_a_cycle() {
    let app = spawn_app().await;
    let key = app.api_key("ops-console", &["identity:write"]).await;
    let link = |from: String, to: String| {
        let key = key.clone();
        let app = &app;
        async move {
            let body = json!({"from": from, "to": to, "reason": "same person"});
            api(
                app,
                reqwest::Method::POST,
                "/api/v1/identity/links",
                &key,
                Some(body),
            )
            .await
        }
    };
    // A race lost once is luck; several rounds give the interleaving a chance to happen.
    for round in 0..10 {
        let (a, b) = (format!("user:a{round}"), format!("user:b{round}"));
        let (ab, ba) = tokio::join!(link(a.clone(), b.clone()), link(b.clone(), a.clone()));
        let mut answers = [ab, ba];
        answers.sort_by_key(|(status, _)| *status);
        let [(made, _), (refused, why)] = &answers;
        assert_eq!(
            (*made, *refused),
            (201, 400),
            "round {round}: one is made, the other refused: {answers:?}"
        );
        assert_eq!(why["error"]["code"], "cycle", "round {round}: {why}");
        let links: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM switchboard.identity_links
              WHERE from_person_id IN ($1, $2)",
        )
        .bind(&a)
        .bind(&b)
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!(links, 1, "round {round}: {a} and {b} hold one link");
    }
    // Only what was made is recorded.
    assert_eq!(audit_rows(&app).await.len(), 10);
    app.shutdown().await;
}
