//! `session.scope`: what one session of an agent spans, with a key an operator can read.
use std::time::Duration;

use switchboard_e2e::{TestApp, spawn_app, spawn_app_configured};
use switchboard_kit::config::SessionScope;

const PERSON: &str = "+14155550161";
const PERSON_DIGITS: &str = "14155550161";
const OTHER: &str = "+14155550162";
const WAIT: Duration = Duration::from_secs(20);

async fn scope_keys(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT scope_key FROM switchboard.sessions ORDER BY scope_key")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// The same phone writes to our Twilio number, then to our TextMagic number.
async fn text_through_both_providers(app: &TestApp) {
    app.send_sms(PERSON, "by twilio").await;
    app.wait_for_sms(1, WAIT).await;
    app.send_textmagic_sms(PERSON_DIGITS, "by textmagic", 8101)
        .await;
    app.wait_for_textmagic(1, WAIT).await;
    app.settle().await;
}

#[tokio::test]
async fn by_default_one_person_is_one_session_per_agent_across_providers() {
    let app = spawn_app().await;
    text_through_both_providers(&app).await;
    assert_eq!(
        scope_keys(&app).await,
        [format!("reggie_oc:person:external:phone:{PERSON}")]
    );
    app.shutdown().await;
}

#[tokio::test]
async fn under_account_channel_scope_each_number_written_to_is_its_own_session() {
    let app = spawn_app_configured(|c| c.session.scope = SessionScope::AccountChannel).await;
    text_through_both_providers(&app).await;
    assert_eq!(
        scope_keys(&app).await,
        [
            format!("reggie_oc:account-channel:sms:+15555550199:external:phone:{PERSON}"),
            format!("reggie_oc:account-channel:sms:447624800500:external:phone:{PERSON}"),
        ]
    );
    // Each session started its own engine session: neither resumed the other's.
    let calls = app.runner.calls();
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|c| c.session_id.is_none()), "{calls:?}");
    app.shutdown().await;
}

#[tokio::test]
async fn under_main_scope_everyone_shares_the_agents_one_session() {
    let app = spawn_app_configured(|c| c.session.scope = SessionScope::Main).await;
    app.send_sms(PERSON, "first person").await;
    app.wait_for_sms(1, WAIT).await;
    app.send_sms(OTHER, "second person").await;
    let sent = app.wait_for_sms(2, WAIT).await;
    app.settle().await;
    assert_eq!(scope_keys(&app).await, ["reggie_oc:main"]);
    // The second person's turn continued the engine session the first one started, and each
    // reply still went to the person who wrote.
    let calls = app.runner.calls();
    assert_eq!(calls[1].session_id.as_deref(), Some("eng-1"));
    let to: Vec<_> = sent.iter().map(|s| s.to.as_str()).collect();
    assert_eq!(to, [PERSON, OTHER]);
    app.shutdown().await;
}

/// The upgrade to readable keys (`migrations/20261123000001_readable_scope_keys.sql`): a
/// session made under the old key is the one the person's next message continues.
#[tokio::test]
async fn a_session_made_before_readable_keys_is_continued_after_the_upgrade() {
    let app = spawn_app().await;
    let old = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO switchboard.sessions
            (id, person_type, person_id, agent_identity, agent_name, engine_type, channel,
             scope_key, engine_session_id, memory_key)
         VALUES ($1, 'external', $2, 'reggie', 'reggie_oc', 'openclaw', 'sms', $3, 'eng-old',
                 'reggie:' || $3)",
    )
    .bind(old)
    .bind(format!("phone:{PERSON}"))
    .bind(format!("external:phone:{PERSON}"))
    .execute(&app.db)
    .await
    .unwrap();
    let upgrade = switchboard_kit::db::MIGRATOR
        .iter()
        .find(|m| m.version == 20261123000001)
        .expect("the readable-keys migration");
    sqlx::raw_sql(&upgrade.sql).execute(&app.db).await.unwrap();
    // Run twice, it changes nothing more.
    sqlx::raw_sql(&upgrade.sql).execute(&app.db).await.unwrap();
    assert_eq!(
        scope_keys(&app).await,
        [format!("reggie_oc:person:external:phone:{PERSON}")]
    );

    app.send_sms(PERSON, "still me").await;
    app.wait_for_sms(1, WAIT).await;
    app.settle().await;
    let sessions: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM switchboard.sessions")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(sessions, [old], "no second session");
    assert_eq!(
        app.runner.calls()[0].session_id.as_deref(),
        Some("eng-old"),
        "the engine session made before the upgrade is resumed"
    );
    app.shutdown().await;
}
