//! A person + agent identity's curated memory (`memory.md`): the person adds to it with
//! `/remember`, the agent edits it in its workspace, an operator reads and replaces it through
//! the API, and every engine variant's next prompt carries it first, as the memory to prefer.
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_e2e::{RunnerCall, TestApp, spawn_app_configured};
use switchboard_memory::curated::Remembered;

const PERSON: &str = "+14155550177";
const WAIT: Duration = Duration::from_secs(20);

fn workspace_root() -> String {
    std::env::temp_dir()
        .join(format!("sb-memory-{}", uuid::Uuid::new_v4().simple()))
        .to_string_lossy()
        .into_owned()
}

async fn memory_row(app: &TestApp, person: &str) -> Option<(String, i64, String)> {
    sqlx::query_as(
        "SELECT body, version, updated_by FROM switchboard.memories
          WHERE person_id = $1 AND agent_identity = 'reggie'",
    )
    .bind(person)
    .fetch_optional(&app.db)
    .await
    .unwrap()
}

async fn person_of_sms(app: &TestApp) -> String {
    sqlx::query_scalar("SELECT person_id FROM switchboard.sessions LIMIT 1")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Ask reggie_oc `text` through the API (waiting for the answer) while the runner holds the
/// call; the request, and the call once the agent has it.
async fn ask_while_held(
    app: &TestApp,
    key: &str,
    text: &str,
) -> (tokio::task::JoinHandle<reqwest::Response>, RunnerCall) {
    app.runner.set_hold(true);
    let request = reqwest::Client::new()
        .post(format!("{}/api/v1/messages", app.gateway_url))
        .bearer_auth(key)
        .json(&json!({"agent": "reggie_oc", "text": text, "wait": true}));
    let asking = tokio::spawn(async move { request.send().await.unwrap() });
    tokio::time::timeout(WAIT, app.runner.received.notified())
        .await
        .expect("the agent was called");
    (asking, app.runner.calls().pop().unwrap())
}

#[tokio::test]
async fn remember_is_answered_at_once_and_the_next_prompt_carries_it_above_the_summary() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root).await;

    app.send_sms(PERSON, "/remember my badge number is 4471")
        .await;
    let sent = app.wait_for_sms(1, WAIT).await;
    assert_eq!(
        sent[0].body,
        "Noted. I will remember: my badge number is 4471"
    );
    assert!(
        app.runner.calls().is_empty(),
        "the agent was not called for /remember"
    );
    let person = person_of_sms(&app).await;
    let (body, version, by) = memory_row(&app, &person).await.expect("a memory");
    assert_eq!(
        (body.as_str(), version, by.as_str()),
        ("- my badge number is 4471", 1, "person")
    );

    app.send_sms(PERSON, "/remember I work nights").await;
    app.wait_for_sms(2, WAIT).await;
    app.send_sms(PERSON, "what is my badge number?").await;
    app.wait_for_sms(3, WAIT).await;
    let call = app
        .runner
        .calls()
        .pop()
        .expect("the question reached the agent");
    let memory = call
        .prompt
        .find("- my badge number is 4471\n- I work nights")
        .unwrap_or_else(|| panic!("both remembered lines, in order, in {}", call.prompt));
    let summary = call
        .prompt
        .find("Summary of earlier conversations")
        .unwrap();
    assert!(memory < summary, "the memory comes before the summary");
    let folder = PathBuf::from(call.workspace.expect("a workspace"));
    assert_eq!(
        std::fs::read_to_string(folder.join("memory.md")).unwrap(),
        "- my badge number is 4471\n- I work nights"
    );
    let written: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.session_events WHERE kind = 'memory_written'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(written, 2, "one journal entry per remembered line");
}

#[tokio::test]
async fn what_the_agent_writes_into_memory_md_is_kept_for_every_engine_variant() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root).await;
    let key = app
        .api_key("crm", &["messages:write", "messages:read"])
        .await;

    // The agent edits memory.md while it answers.
    let (asking, call) = ask_while_held(&app, &key, "I prefer morning shifts").await;
    let folder = PathBuf::from(call.workspace.expect("a workspace"));
    assert_eq!(
        std::fs::read_to_string(folder.join("memory.md")).unwrap(),
        ""
    );
    std::fs::write(folder.join("memory.md"), "- prefers morning shifts\n").unwrap();
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    assert_eq!(asking.await.unwrap().status(), 200);

    let person: String = sqlx::query_scalar(
        "SELECT person_id FROM switchboard.sessions WHERE agent_name = 'reggie_oc'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    let (body, _, by) = memory_row(&app, &person)
        .await
        .expect("the agent's memory was kept");
    assert_eq!(
        (body.as_str(), by.as_str()),
        ("- prefers morning shifts\n", "agent")
    );

    // The other engine variant of the same identity reads it in its first prompt.
    let response = app
        .post_api_message(
            &key,
            json!({"agent": "reggie_fd", "text": "any shifts?", "wait": true}),
            None,
        )
        .await;
    assert_eq!(response.status(), 200);
    let call = app.runner.calls().pop().unwrap();
    assert_eq!(call.agent, "reggie_fd");
    assert!(
        call.prompt.contains("- prefers morning shifts"),
        "{}",
        call.prompt
    );
}

#[tokio::test]
async fn an_operator_reads_and_replaces_a_memory_and_a_long_one_is_cut_visibly() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root;
        c.memory.max_chars = 40;
    })
    .await;
    app.send_sms(PERSON, "hello").await;
    app.wait_for_sms(1, WAIT).await;
    let person = person_of_sms(&app).await;
    let writer = app.api_key("ops", &["memory:read", "memory:write"]).await;
    let reader = app.api_key("support", &["memory:read"]).await;
    let client = reqwest::Client::new();
    let url = |who: &str, q: &str| format!("{}/api/v1/people/{who}/memory{q}", app.gateway_url);

    let put = |key: &str, who: &str, q: &str, body: Value| {
        client
            .put(url(who, q))
            .bearer_auth(key.to_string())
            .json(&body)
            .send()
    };
    let long = "- needs step-free access to every site they work at";
    let r = put(&writer, &person, "?identity=reggie", json!({"body": long}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let shown: Value = r.json().await.unwrap();
    assert_eq!(shown["cut"], true);
    assert_eq!(shown["updated_by"], "api:ops");
    let body = shown["body"].as_str().unwrap();
    assert!(
        body.starts_with(&long[..40]) && body.contains("memory cut here"),
        "{body}"
    );

    let r = put(&reader, &person, "?identity=reggie", json!({"body": "x"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "memory:read does not write");
    let r = put(&writer, &person, "", json!({"body": "x"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "the identity is required");
    let r = put(&writer, &person, "?identity=nobody", json!({"body": "x"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "an identity no agent has");
    let r = put(
        &writer,
        "someone-never-seen",
        "?identity=reggie",
        json!({"body": "x"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 404);

    let read = |q: &str| {
        let request = client.get(url(&person, q)).bearer_auth(&reader);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    assert_eq!(read("?identity=reggie").await["body"].as_str(), Some(body));
    let all = read("").await;
    assert_eq!(all["memories"].as_array().map(Vec::len), Some(1));
    let r = client
        .get(url(&person, "?identity=reggie"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    app.send_sms(PERSON, "what do you know about me?").await;
    app.wait_for_sms(2, WAIT).await;
    let call = app.runner.calls().pop().unwrap();
    assert!(call.prompt.contains(&long[..40]), "{}", call.prompt);
}

#[tokio::test]
async fn remember_past_the_cap_keeps_what_fits_and_tells_the_person_what_was_not_kept() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root;
        c.memory.max_chars = 40;
    })
    .await;
    app.send_sms(PERSON, "/remember my badge number is 4471")
        .await;
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(PERSON, "/remember I need step-free access at every site")
        .await;
    let sent = app.wait_for_sms(2, WAIT).await;
    assert!(
        sent[1]
            .body
            .starts_with("Noted, but your memory here is full (40 characters)"),
        "the person is told the end was not kept: {}",
        sent[1].body
    );
    let person = person_of_sms(&app).await;
    let (body, version, _) = memory_row(&app, &person).await.expect("a memory");
    assert!(
        body.starts_with("- my badge number is 4471\n- I need st")
            && body.contains("[… memory cut here:"),
        "kept up to the cap, with the marker: {body}"
    );
    assert_eq!(version, 2);

    app.send_sms(PERSON, "/remember I work nights").await;
    let sent = app.wait_for_sms(3, WAIT).await;
    assert!(
        sent[2]
            .body
            .starts_with("Not kept: your memory here is full"),
        "{}",
        sent[2].body
    );
    let (after, version, _) = memory_row(&app, &person).await.unwrap();
    assert_eq!(
        (after.as_str(), version),
        (body.as_str(), 2),
        "nothing written"
    );

    // A redelivered /remember writes once and gets the first delivery's answer.
    let session: uuid::Uuid = sqlx::query_scalar("SELECT id FROM switchboard.sessions LIMIT 1")
        .fetch_one(&app.db)
        .await
        .unwrap();
    let store = switchboard_memory::curated::MemoryStore::new(app.db.clone(), 40);
    let once = || store.remember(session, "m-redelivered", "someone-else", "reggie", "hi");
    let first = once().await.unwrap();
    let again = once().await.unwrap();
    assert_eq!((first, again), (Remembered::Kept, Remembered::Kept));
    let (body, version, _) = memory_row(&app, "someone-else").await.unwrap();
    assert_eq!((body.as_str(), version), ("- hi", 1), "written once");
}

#[tokio::test]
async fn an_agents_edit_made_on_an_older_memory_does_not_overwrite_a_newer_one() {
    let root = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root).await;
    let key = app
        .api_key("crm", &["messages:write", "messages:read"])
        .await;
    let ops = app.api_key("ops", &["memory:read", "memory:write"]).await;

    let (asking, call) = ask_while_held(&app, &key, "I moved house").await;
    let folder = PathBuf::from(call.workspace.expect("a workspace"));
    let person: String = sqlx::query_scalar(
        "SELECT person_id FROM switchboard.sessions WHERE agent_name = 'reggie_oc'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    // While the agent works, an operator writes the memory.
    let put = reqwest::Client::new()
        .put(format!(
            "{}/api/v1/people/{person}/memory?identity=reggie",
            app.gateway_url
        ))
        .bearer_auth(&ops)
        .json(&json!({"body": "- new address on file (ops)"}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    // The agent's edit was made on the memory it started from (none).
    std::fs::write(folder.join("memory.md"), "- lives in Leeds\n").unwrap();
    app.runner.set_hold(false);
    app.runner.release.notify_one();
    assert_eq!(
        asking.await.unwrap().status(),
        200,
        "the reply still goes out"
    );

    let (body, version, by) = memory_row(&app, &person).await.unwrap();
    assert_eq!(
        (body.as_str(), version, by.as_str()),
        ("- new address on file (ops)", 1, "api:ops"),
        "the operator's newer memory stays"
    );
    let by_agent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM switchboard.session_events
          WHERE kind = 'memory_written' AND detail->>'by' = 'agent'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(by_agent, 0, "no journal entry claims the agent's write");
    assert!(
        app.metrics().await.contains("sb_memory_conflicts_total 1"),
        "the conflict is counted"
    );
}

/// The day a prompt's daily notes call today (`## memory/<day>.md (today)`), if it has any.
fn notes_today(prompt: &str) -> Option<chrono::NaiveDate> {
    let at = prompt.find(".md (today)")?;
    let day = prompt[..at].rsplit("memory/").next()?;
    chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d").ok()
}

#[tokio::test]
async fn the_agents_daily_notes_of_today_and_yesterday_are_in_its_next_prompt_and_no_others() {
    // Seeds 001 and 004: the agent keeps notes of each day in memory/YYYY-MM-DD.md; today's
    // and yesterday's come back after the curated memory. Its files are untrusted: a note that
    // is a link to a file elsewhere is not read.
    let root = workspace_root();
    let app = spawn_app_configured(move |c| c.workspace.root = root).await;
    app.send_sms(PERSON, "hello").await;
    app.wait_for_sms(1, WAIT).await;
    let first = app.runner.calls().pop().unwrap();
    assert!(!first.prompt.contains("daily notes"), "{}", first.prompt);
    let folder = PathBuf::from(first.workspace.expect("a workspace"));
    // The agent writes its notes, as it would with its file tools.
    let notes = folder.join("memory");
    std::fs::create_dir_all(&notes).unwrap();
    let today = chrono::Utc::now().date_naive();
    let note = |back: u64| format!("- written {back} days back");
    for back in 0..4 {
        let day = today - chrono::Days::new(back);
        std::fs::write(notes.join(format!("{day}.md")), note(back)).unwrap();
    }
    app.send_sms(PERSON, "where were we?").await;
    app.wait_for_sms(2, WAIT).await;
    let prompt = app.runner.calls().pop().unwrap().prompt;
    // (A turn just past midnight UTC finds tomorrow's "today": the notes follow its calendar.)
    let day = notes_today(&prompt).unwrap_or_else(|| panic!("daily notes in {prompt}"));
    let back = (today - day).num_days();
    assert!(back == 0 || back == -1, "today is {day}: {prompt}");
    let shown: Vec<u64> = (0..4).filter(|b| prompt.contains(&note(*b))).collect();
    let expected: Vec<u64> = [back, back + 1]
        .into_iter()
        .filter(|b| (0..4).contains(b))
        .map(|b| b as u64)
        .collect();
    assert_eq!(
        shown, expected,
        "today's and yesterday's notes only: {prompt}"
    );
    let memory = prompt.find("Curated memory of this person").unwrap();
    assert!(
        memory < prompt.find("Your daily notes").unwrap(),
        "{prompt}"
    );

    // Today's note replaced by a link to a file outside the workspace: not read.
    let outside = std::env::temp_dir().join(format!("sb-outside-{}", uuid::Uuid::new_v4()));
    std::fs::write(&outside, "SECRET-OUTSIDE-THE-WORKSPACE").unwrap();
    let todays = notes.join(format!("{day}.md"));
    std::fs::remove_file(&todays).ok();
    std::os::unix::fs::symlink(&outside, &todays).unwrap();
    app.send_sms(PERSON, "and now?").await;
    app.wait_for_sms(3, WAIT).await;
    let prompt = app.runner.calls().pop().unwrap().prompt;
    assert!(!prompt.contains("SECRET-OUTSIDE"), "{prompt}");
    if back == 0 {
        assert!(
            prompt.contains(&note(1)),
            "yesterday's still read: {prompt}"
        );
    }
    std::fs::remove_file(&outside).ok();
}
