//! The embedded stack (the `stack` tool, services/stack) lets in only who holds the credentials it
//! generated: NATS refuses a connection without them or with a wrong password, Postgres
//! refuses TCP logins without the password (the product's role included, the superuser too),
//! the product's role is no superuser, each NATS user can do only what it is for (the
//! read-only `analytics` user reads the public events and cannot publish into the work
//! subjects, create consumers or read other clients' replies), the files that hold the secrets
//! are readable by their owner only, and `stack status` shows no password.
//!
//! The stack's `up`/`env` print `SB_STACK_CREDENTIALS_DIR`; against servers of your own
//! (`SB_NATS_URL`/`SB_DATABASE_URL` set by hand, no stack) there is nothing to check here. When
//! `make test` started the embedded stack it says so (`SB_TEST_EMBEDDED_STACK`): then a missing
//! credentials directory fails these tests instead of skipping them.
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use sqlx::{Connection, PgConnection};
use switchboard_kit::endpoint::{NatsAuth, nats_connect, nats_target};
use tokio::sync::mpsc;

const BOUND: Duration = Duration::from_secs(10);

struct StackUnderTest {
    nats_url: String,
    database_url: String,
    credentials: PathBuf,
    secrets: HashMap<String, String>,
}

/// The stack `make test` started, or `None` (and why) when the tests run against other servers.
fn stack() -> Option<StackUnderTest> {
    let embedded = std::env::var_os("SB_TEST_EMBEDDED_STACK").is_some_and(|v| !v.is_empty());
    let credentials = std::env::var_os("SB_STACK_CREDENTIALS_DIR").map(PathBuf::from);
    let Some(credentials) = credentials else {
        // `make test` started the stack, yet nothing says where its credentials are: the
        // checks below would all pass without checking anything.
        assert!(
            !embedded,
            "`make test` started the embedded stack (SB_TEST_EMBEDDED_STACK is set) but \
             SB_STACK_CREDENTIALS_DIR is not: `stack up` must print it"
        );
        eprintln!(
            "skipped: SB_STACK_CREDENTIALS_DIR is not set and SB_TEST_EMBEDDED_STACK is not \
             either, so these tests run against servers of your own (SB_NATS_URL and \
             SB_DATABASE_URL given to `make test`): there is no embedded stack to check"
        );
        return None;
    };
    let secrets = std::fs::read_to_string(credentials.join("secrets"))
        .expect("the stack's secrets file")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Some(StackUnderTest {
        nats_url: std::env::var("SB_NATS_URL").expect("SB_NATS_URL"),
        database_url: std::env::var("SB_DATABASE_URL").expect("SB_DATABASE_URL"),
        credentials,
        secrets,
    })
}

/// The NATS server's address, without credentials.
fn nats_server(s: &StackUnderTest) -> String {
    nats_target(&s.nats_url).expect("a NATS URL").servers[0].clone()
}

async fn nats_refused(options: async_nats::ConnectOptions, server: &str) -> String {
    match tokio::time::timeout(BOUND, options.connect(server)).await {
        Ok(Ok(_)) => panic!("NATS at {server} accepted the connection"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("NATS at {server} neither accepted nor refused within {BOUND:?}"),
    }
}

#[tokio::test]
async fn nats_refuses_clients_without_the_credentials() {
    let Some(s) = stack() else { return };
    let server = nats_server(&s);
    let NatsAuth::UserPassword { user, password } = nats_target(&s.nats_url).unwrap().auth else {
        panic!("SB_NATS_URL carries no user and password");
    };
    assert_eq!(s.secrets["NATS_PASSWORD"], password, "the URL's password");

    let anonymous = nats_refused(async_nats::ConnectOptions::new(), &server).await;
    assert!(anonymous.contains("authorization"), "{anonymous}");
    let wrong = nats_refused(
        async_nats::ConnectOptions::with_user_and_password(user.clone(), "not-the-password".into()),
        &server,
    )
    .await;
    assert!(wrong.contains("authorization"), "{wrong}");
    let other_user = nats_refused(
        async_nats::ConnectOptions::with_user_and_password("admin".into(), password.clone()),
        &server,
    )
    .await;
    assert!(other_user.contains("authorization"), "{other_user}");

    let client = nats_connect(&s.nats_url, async_nats::ConnectOptions::new())
        .await
        .expect("the printed URL connects");
    client.flush().await.expect("flush");
}

/// A client whose server errors (permission violations) arrive on the returned channel.
async fn watched_client(
    url: &str,
    options: async_nats::ConnectOptions,
) -> (async_nats::Client, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let options = options.event_callback(move |event| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(event.to_string());
        }
    });
    let client = nats_connect(url, options).await.expect("connect");
    (client, rx)
}

/// The next permission violation the server reports, if one comes within a short while.
async fn violation(events: &mut mpsc::UnboundedReceiver<String>) -> Option<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(e)) if e.contains("Permissions Violation") => return Some(e),
            Ok(Some(_)) => continue,
            _ => return None,
        }
    }
}

#[tokio::test]
async fn each_nats_user_can_do_only_what_it_is_for() {
    let Some(s) = stack() else { return };
    let tag = uuid::Uuid::new_v4().simple().to_string();

    // The product: its subjects under any prefix, nothing outside them.
    let (product, mut product_events) =
        watched_client(&s.nats_url, async_nats::ConnectOptions::new()).await;
    product
        .publish(format!("notswitchboard{tag}"), "x".into())
        .await
        .unwrap();
    product.flush().await.unwrap();
    let v = violation(&mut product_events).await;
    assert!(
        v.as_deref().is_some_and(|v| v.contains("Publish")),
        "the product may publish outside its subjects: {v:?}"
    );

    // analytics: reads the public events of prefix `sb`, live...
    let (analytics, mut analytics_events) = analytics_client(&s).await;
    let mut events = analytics
        .subscribe(format!("sb.events.credentials-test-{tag}"))
        .await
        .unwrap();
    analytics.flush().await.unwrap();
    assert_eq!(violation(&mut analytics_events).await, None);
    product
        .publish(format!("sb.events.credentials-test-{tag}"), "event".into())
        .await
        .unwrap();
    product.flush().await.unwrap();
    let got = tokio::time::timeout(BOUND, events.next())
        .await
        .expect("the event reaches analytics")
        .expect("subscription open");
    assert_eq!(&got.payload[..], b"event");

    // ...but cannot publish an inbound message, nor read the work subjects.
    analytics
        .publish("sb.in.sms", "forged inbound".into())
        .await
        .unwrap();
    analytics.flush().await.unwrap();
    let v = violation(&mut analytics_events).await;
    assert!(
        v.as_deref().is_some_and(|v| v.contains("Publish")),
        "analytics may publish into the work subjects: {v:?}"
    );
    let _work = analytics.subscribe("sb.in.>").await.unwrap();
    analytics.flush().await.unwrap();
    let v = violation(&mut analytics_events).await;
    assert!(
        v.as_deref().is_some_and(|v| v.contains("Subscription")),
        "analytics may read the work subjects: {v:?}"
    );
}

/// analytics, connected as services/stack/src/nats.rs says it must (its own inbox prefix).
async fn analytics_client(
    s: &StackUnderTest,
) -> (async_nats::Client, mpsc::UnboundedReceiver<String>) {
    let url = format!(
        "nats://{}:{}@{}",
        s.secrets["NATS_ANALYTICS_USER"],
        s.secrets["NATS_ANALYTICS_PASSWORD"],
        nats_server(s).trim_start_matches("nats://")
    );
    watched_client(
        &url,
        async_nats::ConnectOptions::new().custom_inbox_prefix("_INBOX_analytics"),
    )
    .await
}

#[tokio::test]
async fn analytics_reads_the_events_by_sequence_but_creates_no_consumer_and_sees_no_other_replies()
{
    let Some(s) = stack() else { return };
    let (analytics, mut events) = analytics_client(&s).await;
    // The stack's analytics prefix is `sb` (SB_STACK_ANALYTICS_PREFIX unset under `make test`).
    let topology = switchboard_kit::Topology::new("sb", 1);
    let (work, public) = (topology.work_stream(), topology.events_stream());

    // What it is for: asking about the event stream, answered on its own inbox (the stream
    // may not exist on a test stack; the answer says so, and no permission is violated). It
    // asks under its account's API prefix: the product's streams are in another account.
    let answer = tokio::time::timeout(
        BOUND,
        analytics.request(
            format!(
                "{}.STREAM.INFO.{public}",
                switchboard_stack::readers::EVENTS_API_PREFIX
            ),
            "".into(),
        ),
    )
    .await
    .expect("answered in time")
    .expect("the JetStream API answers analytics");
    assert!(!answer.payload.is_empty());
    assert_eq!(violation(&mut events).await, None);

    // No consumer on the work stream (it would read every person's messages), nor on the
    // event stream (a push consumer's deliver subject is not checked against its creator's
    // rights, nats-server issue 8274), in any of the API's forms.
    for subject in [
        format!("$JS.API.CONSUMER.CREATE.{work}"),
        format!("$JS.API.CONSUMER.CREATE.{work}.reader.sb.in.>"),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{work}.reader"),
        format!("$JS.API.CONSUMER.CREATE.{public}"),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{public}.reader"),
    ] {
        analytics
            .publish(subject.clone(), "{}".into())
            .await
            .unwrap();
        analytics.flush().await.unwrap();
        let v = violation(&mut events).await;
        assert!(
            v.as_deref().is_some_and(|v| v.contains("Publish")),
            "analytics may publish {subject}: {v:?}"
        );
    }

    // Nor the shared reply inboxes, where the product's JetStream and key-value answers (and
    // anyone else's replies) go.
    let _others = analytics.subscribe("_INBOX.>").await.unwrap();
    analytics.flush().await.unwrap();
    let v = violation(&mut events).await;
    assert!(
        v.as_deref().is_some_and(|v| v.contains("Subscription")),
        "analytics may read other clients' replies: {v:?}"
    );
}

#[tokio::test]
async fn stack_status_shows_the_urls_without_any_password() {
    let Some(s) = stack() else { return };
    // <root>/<name>/credentials
    let stack_dir = s.credentials.parent().expect("<stack>/credentials");
    let name = stack_dir.file_name().unwrap().to_str().unwrap();
    let root = stack_dir.parent().expect("the stacks' root");
    let stack = switchboard_e2e::stack_bin().expect("the stack tool");
    let out = std::process::Command::new(stack)
        .args(["status", name])
        .env("SB_STACK_DIR", root)
        .output()
        .expect("run stack status");
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the stack is up: {shown}");
    assert!(
        shown.contains("SB_NATS_URL=nats://switchboard:***@"),
        "{shown}"
    );
    assert!(
        shown.contains("SB_DATABASE_URL=postgres://switchboard:***@"),
        "{shown}"
    );
    for (key, secret) in &s.secrets {
        if key.contains("PASSWORD") {
            assert!(
                !shown.contains(secret.as_str()),
                "status shows {key}: {shown}"
            );
        }
    }
}

async fn pg_refused(url: &str) -> String {
    match tokio::time::timeout(BOUND, PgConnection::connect(url)).await {
        Ok(Ok(_)) => panic!(
            "Postgres accepted {}",
            switchboard_kit::endpoint::redact_url(url)
        ),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("Postgres neither accepted nor refused within {BOUND:?}"),
    }
}

#[tokio::test]
async fn postgres_refuses_logins_without_the_password() {
    let Some(s) = stack() else { return };
    let mut url = url::Url::parse(&s.database_url).expect("a Postgres URL");
    assert_eq!(url.username(), "switchboard");
    assert_eq!(url.password(), Some(s.secrets["PG_PASSWORD"].as_str()));

    let mut conn = PgConnection::connect(&s.database_url)
        .await
        .expect("the printed URL connects");
    let (superuser, createdb): (bool, bool) =
        sqlx::query_as("SELECT rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(!superuser, "the product's role is a superuser");
    assert!(
        createdb,
        "tests create their databases as the product's role"
    );
    url.set_password(None).unwrap();
    let none = pg_refused(url.as_str()).await;
    assert!(none.contains("password"), "{none}");
    url.set_password(Some("not-the-password")).unwrap();
    let wrong = pg_refused(url.as_str()).await;
    assert!(wrong.contains("password authentication failed"), "{wrong}");
    url.set_username("postgres").unwrap();
    url.set_password(None).unwrap();
    let superuser = pg_refused(url.as_str()).await;
    assert!(superuser.contains("password"), "{superuser}");
    url.set_password(Some(&s.secrets["PG_PASSWORD"])).unwrap();
    let borrowed = pg_refused(url.as_str()).await;
    assert!(
        borrowed.contains("password authentication failed"),
        "{borrowed}"
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test]
async fn the_secrets_are_readable_by_their_owner_only() {
    let Some(s) = stack() else { return };
    assert_eq!(mode(&s.credentials), 0o700, "{}", s.credentials.display());
    let mut files = 0;
    for entry in std::fs::read_dir(&s.credentials).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
        files += 1;
    }
    assert!(files >= 3, "secrets, pgpass and env");

    // The NATS config holds the passwords too; Postgres' pg_hba.conf trusts no TCP client.
    let stack_dir = s.credentials.parent().expect("<stack>/credentials");
    let nats_conf = stack_dir.join("nats/nats.conf");
    assert_eq!(mode(&nats_conf), 0o600, "{}", nats_conf.display());
    assert_eq!(mode(&stack_dir.join("nats")), 0o700);
    let ports = std::fs::read_to_string(stack_dir.join("ports")).unwrap();
    let pg_dir = ports
        .lines()
        .find_map(|l| l.strip_prefix("PG_DIR="))
        .expect("PG_DIR in ports");
    let hba_path = Path::new(pg_dir).join("data/pg_hba.conf");
    let hba = std::fs::read_to_string(&hba_path).unwrap();
    let tcp: Vec<&str> = hba.lines().filter(|l| l.starts_with("host")).collect();
    assert!(!tcp.is_empty(), "{hba}");
    for line in tcp {
        assert!(line.ends_with("scram-sha-256"), "{line}");
    }
    assert_eq!(mode(&hba_path), 0o600);
    // The socket the superuser may use without a password sits in a folder only its owner enters.
    assert_eq!(mode(&Path::new(pg_dir).join("data")), 0o700);
}
