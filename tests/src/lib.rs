//! Test helpers: [`spawn_app`] runs Switchboard against the real NATS and Postgres started by
//! `make test` (`SB_NATS_URL`, `SB_DATABASE_URL`), on a fresh database and subject prefix, with
//! Twilio and the agent runner faked as real HTTP servers.
pub mod browser;
pub mod chat;
pub mod embedding_checks;
pub mod runner_host;
pub mod tcp_cut;
pub use slack::{SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, SLACK_TEAM};
pub use telegram::{TELEGRAM_BOT_ID, TELEGRAM_BOT_TOKEN, TELEGRAM_SECRET};
pub use twilio_whatsapp::{TWILIO_WHATSAPP_FROM, TWILIO_WHATSAPP_ROUTE};
pub use whatsapp::{
    WHATSAPP_APP_SECRET, WHATSAPP_NUMBER_ID, WHATSAPP_TOKEN, WHATSAPP_VERIFY_TOKEN,
};

/// The third parties, one fake each (the `switchboard-fakes` crate).
pub use switchboard_fakes as fakes;
pub use switchboard_fakes::model as openai_fake;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use sqlx::{Connection, PgPool};
use switchboard::stages;
use switchboard_channels::{Adapter, Channels};
use switchboard_kit::config::{AgentConfig, Config, Secret};
use switchboard_kit::proto::{DeadLetter, Reply};
use switchboard_kit::startup::App;
use switchboard_kit::{Registration, Topology};
use tokio::process::{Child, Command};

mod held;
mod proof;
mod receipts;
mod slack;
mod telegram;
mod twilio_whatsapp;
mod whatsapp;

pub use chat::{CHAT_SECRET, ChatClient, chat_token};
pub use fakes::{
    CallbackRequest, FakeCallbackReceiver, FakeRunner, FakeTextMagic, FakeTwilio, RunnerCall,
    SentSms, webhook_signature,
};
pub use openai_fake::{ChatCall, FakeAnswer, FakeModel};

/// How long [`TestApp::cli`] waits for one CLI command (a backup, a re-embedding: seconds).
pub const CLI_TIMEOUT: Duration = Duration::from_secs(120);

pub const TWILIO_NUMBER: &str = "+15555550199";
/// Our TextMagic number, as TextMagic writes numbers (digits, no `+`).
pub const TEXTMAGIC_NUMBER: &str = "447624800500";
/// The secret in our TextMagic callback URL.
pub const TEXTMAGIC_TOKEN: &str = "tm-callback-7f3a";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: run the end-to-end tests with `make test`, which starts the stack"
        )
    })
}

/// The form fields Twilio posts for an inbound SMS to our number.
pub fn twilio_sms_params(
    account_sid: &str,
    from: &str,
    text: &str,
    sid: &str,
) -> Vec<(String, String)> {
    vec![
        ("AccountSid".into(), account_sid.into()),
        ("ApiVersion".into(), "2010-04-01".into()),
        ("Body".into(), text.into()),
        ("From".into(), from.into()),
        ("MessageSid".into(), sid.into()),
        ("NumMedia".into(), "0".into()),
        ("SmsSid".into(), sid.into()),
        ("SmsStatus".into(), "received".into()),
        ("To".into(), TWILIO_NUMBER.into()),
    ]
}

pub struct AppOptions {
    /// The stages the app has, in data-path order: the product's (`stages::ALL`), and any a
    /// test adds ([`AppOptions::with_stage`]). Their consumers are made with the topology.
    pub stages: Vec<Registration>,
    /// Stages run inside the test process; the others can be started as real worker processes
    /// with [`TestApp::spawn_worker`].
    pub in_process: Vec<&'static str>,
    /// The channel adapters the app has: the product's (`switchboard_channels::ADAPTERS`), and
    /// any a test adds ([`AppOptions::with_channel`]).
    pub channels: Channels,
    pub tweak: Box<dyn FnOnce(&mut Config) + Send>,
}

impl AppOptions {
    /// Every stage in the test process but dispatch, which the test starts as real worker
    /// processes ([`TestApp::spawn_worker`]) to kill or stop them.
    pub fn dispatch_as_processes() -> Self {
        Self {
            in_process: stages::names()
                .into_iter()
                .filter(|s| *s != "dispatch")
                .collect(),
            ..Default::default()
        }
    }
}

/// Ask a worker process to stop, as an orchestrator does (SIGTERM): it drains and exits.
pub fn sigterm(worker: &Child) {
    let pid = worker.id().expect("a running worker").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("send SIGTERM");
    assert!(sent.success(), "SIGTERM to {pid}");
}

impl AppOptions {
    /// Every stage in the test process but `stage`, which the test starts itself
    /// ([`TestApp::start_stage`]) once it has set the scene.
    pub fn all_but(stage: &str) -> Self {
        Self::without(&[stage])
    }

    /// Every stage in the test process but `left_out`, which do not run at all unless the test
    /// starts them (e.g. a test counting one worker's model calls leaves out the others that call
    /// the same fake model).
    pub fn without(left_out: &[&str]) -> Self {
        Self {
            in_process: stages::names()
                .into_iter()
                .filter(|s| !left_out.contains(s))
                .collect(),
            ..Default::default()
        }
    }

    /// The app with one more stage, run in the test process: what adding a stage to the
    /// product's list (`stages::ALL`) does (docs/adding-a-stage.md).
    pub fn with_stage(mut self, stage: Registration) -> Self {
        self.in_process.push(stage.spec.name);
        self.stages.push(stage);
        self
    }

    /// The app with one more channel adapter: what adding a channel to the product's list
    /// (`switchboard_channels::ADAPTERS`) does (docs/adding-a-channel.md).
    pub fn with_channel(mut self, adapter: Adapter) -> Self {
        self.channels = self.channels.with(adapter);
        self
    }

    /// The configuration changed by `tweak` before the app starts.
    pub fn configured(self, tweak: impl FnOnce(&mut Config) + Send + 'static) -> Self {
        Self {
            tweak: Box::new(tweak),
            ..self
        }
    }
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            stages: stages::ALL.to_vec(),
            in_process: stages::names(),
            channels: Channels::product(),
            tweak: Box::new(|_| {}),
        }
    }
}

pub struct TestApp {
    pub config: Config,
    pub config_path: PathBuf,
    pub gateway_url: String,
    /// Where `/metrics` is served (not on the public gateway port).
    pub admin_url: String,
    pub db: PgPool,
    pub js: jetstream::Context,
    pub topology: Topology,
    pub twilio: FakeTwilio,
    pub textmagic: FakeTextMagic,
    pub telegram: switchboard_fakes::FakeTelegram,
    pub slack: switchboard_fakes::FakeSlack,
    pub whatsapp: switchboard_fakes::FakeWhatsApp,
    pub runner: FakeRunner,
    app: App,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Stages left out of the app and not started since: [`TestApp::settle`] does not wait for
    /// their consumers, which nobody reads.
    idle_stages: std::sync::Mutex<Vec<&'static str>>,
    /// Every stage the app has (the product's and any the test added).
    stages: Vec<Registration>,
    /// This test's own database, dropped with the app.
    database: String,
}

/// `SB_TEST_KEEP_DATABASES=1` keeps each test's database after it ends (to look into a failure).
const KEEP_DATABASES: &str = "SB_TEST_KEEP_DATABASES";

impl Drop for TestApp {
    /// A test's database goes with it: a full run makes hundreds (~9 MB each), and a CI run on a
    /// shared disk once lost its Postgres to a full disk halfway through the suite.
    fn drop(&mut self) {
        self.app.shutdown.trigger();
        self.handle.abort();
        if std::env::var(KEEP_DATABASES).as_deref() == Ok("1") {
            return;
        }
        let Ok(admin_url) = std::env::var("SB_DATABASE_URL") else {
            return;
        };
        let name = self.database.clone();
        // Drop runs inside the test's runtime, which cannot be blocked on: a thread of its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&admin_url).await.ok()?;
                // FORCE: the app's pools and any worker it started still hold connections.
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            eprintln!("test database {} was not dropped", self.database);
        }
    }
}

/// A worker process started by [`TestApp::spawn_logged_worker`].
pub struct LoggedWorker {
    pub child: Child,
    /// Where its `/metrics` are served.
    pub admin_url: String,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl LoggedWorker {
    /// What it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Its Prometheus page.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.admin_url))
            .await
            .expect("the worker's admin port answers")
            .text()
            .await
            .expect("metrics body")
    }
}

/// A log row as a user would check it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LogRow {
    pub direction: String,
    pub message: String,
    pub correlation_id: String,
    pub session_id: uuid::Uuid,
    pub person_id: String,
    pub processing_ms: Option<i64>,
    pub tool_calls_count: Option<i64>,
    pub id: uuid::Uuid,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(AppOptions::default()).await
}

/// The local embedder's files as the stack fetched them (`stack env` prints the variables):
/// the model, and ONNX Runtime with the derived graph (the product's default runtime; candle
/// when they are absent). A worker given a configuration file does not read `SB_*` itself.
pub fn local_embedder_from_stack(e: &mut switchboard_kit::memory_config::EmbeddingConfig) {
    local_embedder_from(e, |var| std::env::var(var).ok());
}

/// [`local_embedder_from_stack`] with the variables looked up by `var` (e.g. in what a
/// `stack up` printed: the load tools' `Stack::var`).
pub fn local_embedder_from(
    e: &mut switchboard_kit::memory_config::EmbeddingConfig,
    var: impl Fn(&str) -> Option<String>,
) {
    for (name, field) in [
        ("SB_EMBEDDING__MODEL_DIR", &mut e.model_dir),
        ("SB_EMBEDDING__ONNX_RUNTIME", &mut e.onnx_runtime),
        ("SB_EMBEDDING__ONNX_MODEL", &mut e.onnx_model),
        ("SB_EMBEDDING__STATIC_DIR", &mut e.static_dir),
    ] {
        if let Some(value) = var(name) {
            *field = value;
        }
    }
}

/// `[embedding]` on the static model the stack fetched (`provider = "static"`, its own id and
/// width), the folder looked up by `var`.
pub fn static_embedder_from(
    e: &mut switchboard_kit::memory_config::EmbeddingConfig,
    var: impl Fn(&str) -> Option<String>,
) {
    use switchboard_kit::memory_config::{
        EmbeddingProvider, STATIC_EMBEDDING_DIMENSIONS, STATIC_EMBEDDING_MODEL,
    };
    e.provider = EmbeddingProvider::Static;
    e.model = STATIC_EMBEDDING_MODEL.into();
    e.dimensions = STATIC_EMBEDDING_DIMENSIONS;
    if let Some(dir) = var("SB_EMBEDDING__STATIC_DIR") {
        e.static_dir = dir;
    }
}

/// The body of a prompt's recall block (between its two RECALL lines), if it has one.
pub fn recall_block(prompt: &str) -> Option<String> {
    let mut lines = prompt.lines().skip_while(|l| !l.starts_with("RECALL-"));
    lines.next()?;
    let body: Vec<&str> = lines.take_while(|l| !l.starts_with("RECALL-")).collect();
    Some(body.join("\n"))
}

pub async fn fresh_database(admin_url: &str) -> String {
    // A UUIDv7 carries its creation time: how old a left-over database is.
    let name = format!("{TEST_DATABASE_PREFIX}{}", uuid::Uuid::now_v7().simple());
    let mut conn = sqlx::PgConnection::connect(admin_url)
        .await
        .expect("connect to the test Postgres");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create test database");
    drop_stale_databases(&mut conn).await;
    let (base, _) = admin_url.rsplit_once('/').expect("database url has a path");
    format!("{base}/{name}")
}

const TEST_DATABASE_PREFIX: &str = "sbt_";
/// Test databases older than this are left over from earlier runs (a run takes minutes):
/// nothing drops a test's database when it ends, and a developer's stack would otherwise fill
/// the disk (seen: 1,134 of them, 10 GB).
const STALE_TEST_DATABASE: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// Drop the test databases made more than [`STALE_TEST_DATABASE`] ago (best effort: one in
/// use is left for the next time).
async fn drop_stale_databases(conn: &mut sqlx::PgConnection) {
    let Ok(names) = sqlx::query_scalar::<_, String>(
        "SELECT datname::text FROM pg_database WHERE starts_with(datname, $1)",
    )
    .bind(TEST_DATABASE_PREFIX)
    .fetch_all(&mut *conn)
    .await
    else {
        return;
    };
    let now = std::time::SystemTime::now();
    for name in names {
        let Some(id) = name
            .strip_prefix(TEST_DATABASE_PREFIX)
            .and_then(|s| uuid::Uuid::parse_str(s).ok())
        else {
            continue;
        };
        let stale = match id.get_timestamp() {
            Some(t) => {
                let (secs, nanos) = t.to_unix();
                let made = std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
                now.duration_since(made)
                    .is_ok_and(|age| age > STALE_TEST_DATABASE)
            }
            // Named by a UUIDv4 before the names carried their time: from an earlier version.
            None => id.get_version_num() == 4,
        };
        if stale {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
                .execute(&mut *conn)
                .await;
        }
    }
}

/// Write `contents` to `path` readable by its owner only (a worker's configuration holds the
/// stack's passwords in its URLs); an existing file is replaced, not reused with its mode.
pub fn write_private(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(contents.as_bytes())
}

/// [`spawn_app`] with some configuration changed (all stages in process).
pub async fn spawn_app_configured(tweak: impl FnOnce(&mut Config) + Send + 'static) -> TestApp {
    spawn_app_with(AppOptions {
        tweak: Box::new(tweak),
        ..Default::default()
    })
    .await
}

pub async fn spawn_app_with(opts: AppOptions) -> TestApp {
    let _ = tracing_subscriber_init();
    let nats_url = env("SB_NATS_URL");
    let database_url = fresh_database(&env("SB_DATABASE_URL")).await;
    let twilio = FakeTwilio::start("ACtest00000000000000000000000000", "test-auth-token").await;
    let textmagic = FakeTextMagic::start("switchboard-test", "tm-api-key").await;
    let telegram = switchboard_fakes::FakeTelegram::start(TELEGRAM_BOT_TOKEN).await;
    let slack = switchboard_fakes::FakeSlack::start(SLACK_BOT_TOKEN, SLACK_TEAM).await;
    let whatsapp = switchboard_fakes::FakeWhatsApp::start(WHATSAPP_TOKEN, WHATSAPP_NUMBER_ID).await;
    let runner = FakeRunner::start().await;
    let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();

    let mut config = Config {
        nats_url: nats_url.into(),
        database_url: database_url.clone().into(),
        subject_prefix: format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        ..Config::default()
    };
    config.gateway.http_addr = addr.to_string();
    config.gateway.public_url = format!("http://{addr}");
    config.twilio.account_sid = twilio.account_sid.clone();
    config.twilio.auth_token = Secret::new(twilio.auth_token.clone());
    config.twilio.from_number = TWILIO_NUMBER.into();
    config.twilio.api_base = twilio.url.clone();
    config.textmagic.username = textmagic.username.clone();
    config.textmagic.api_key = Secret::new(textmagic.api_key.clone());
    config.textmagic.api_base = textmagic.url.clone();
    config.textmagic.webhook_token = Secret::new(TEXTMAGIC_TOKEN);
    telegram::configure(&mut config, &telegram);
    slack::configure(&mut config, &slack);
    whatsapp::configure(&mut config, &whatsapp);
    config.chat.jwt_secret = Secret::new(CHAT_SECRET);
    local_embedder_from_stack(&mut config.embedding);
    config.agents = vec![
        AgentConfig {
            name: "reggie_oc".into(),
            identity: "reggie".into(),
            engine: "openclaw".into(),
            runner_url: runner.url.clone(),
            token: Secret::new("runner-token"),
            timeout_s: 10,
            concurrency: 16,
            ..Default::default()
        },
        AgentConfig {
            name: "reggie_fd".into(),
            identity: "reggie".into(),
            engine: "droid".into(),
            runner_url: runner.url.clone(),
            token: Secret::default(),
            timeout_s: 10,
            concurrency: 16,
            ..Default::default()
        },
    ];
    config.runtime.ack_wait_ms = 2_000;
    config.runtime.retry_base_ms = 100;
    config.runtime.retry_max_ms = 1_000;
    config.runtime.shutdown_grace_ms = 2_000;
    config.runtime.turn_partitions = 4;
    config.runtime.batch = 16;
    config.runtime.concurrency = 16;
    config.dispatch.hold_timeout_ms = 2_000;
    // The test stack's folder (`<stack>/credentials` is exported by the stack tool): readers'
    // NATS users go into its config (`switchboard readers add`).
    config.readers.local_stack = std::env::var_os("SB_STACK_CREDENTIALS_DIR")
        .map(PathBuf::from)
        .and_then(|d| d.parent().map(|p| p.to_path_buf()));
    (opts.tweak)(&mut config);

    let config_path = std::env::temp_dir().join(format!("{}.toml", config.subject_prefix));
    write_private(
        &config_path,
        &toml::to_string(&config).expect("config as TOML"),
    )
    .expect("write test config");

    // As a worker starts: a JetStream API request that a NATS configuration reload drops (another
    // test adding a reader) is tried again, not a failed test.
    let app = App::start(
        config.clone(),
        "test",
        &opts.stages,
        Duration::from_secs(30),
    )
    .await
    .expect("connect, migrations and topology")
    .with(opts.channels.clone());
    let (routes, follower) = switchboard::gateway_routes(&app).expect("gateway");
    let admin_listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
    let admin_url = format!("http://{}", admin_listener.local_addr().unwrap());
    let mut tasks = stages::tasks(
        &app,
        &stages::select_from(&opts.stages, &opts.in_process).expect("known stages"),
    );
    tasks.push(follower);
    tasks.push(app.serve_listener(listener, routes).expect("serve"));
    tasks.push(
        app.serve_listener(
            admin_listener,
            // As a gateway process serves it: with the ops console.
            switchboard_kit::admin::router(app.readiness())
                .merge(switchboard::console_router(&app).expect("the console")),
        )
        .expect("serve admin"),
    );
    let handle = tokio::spawn(app.clone().run(tasks));
    let idle_stages = opts
        .stages
        .iter()
        .map(|r| r.spec.name)
        .filter(|s| !opts.in_process.contains(s))
        .collect();

    TestApp {
        gateway_url: format!("http://{addr}"),
        admin_url,
        db: app.db.clone(),
        js: app.js.clone(),
        topology: app.topology.clone(),
        config,
        config_path,
        twilio,
        textmagic,
        telegram,
        slack,
        whatsapp,
        runner,
        app,
        handle,
        idle_stages: std::sync::Mutex::new(idle_stages),
        stages: opts.stages,
        database: database_name(&database_url),
    }
}

/// The database's name: the last path segment of its URL.
fn database_name(url: &str) -> String {
    let path = url.rsplit_once('/').map_or(url, |(_, name)| name);
    path.split(['?', '#']).next().unwrap_or(path).to_string()
}

/// What a fake provider sent, once it has sent at least `n` messages.
async fn wait_for_sent<T: std::fmt::Debug>(
    what: &str,
    n: usize,
    timeout: Duration,
    sent: impl Fn() -> Vec<T>,
) -> Vec<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let sent = sent();
        if sent.len() >= n {
            return sent;
        }
        if Instant::now() >= deadline {
            panic!(
                "expected {n} {what} within {timeout:?}, got {}: {sent:?}",
                sent.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The stack's `SB_*` variables of this process, which a child process given its own
/// configuration file must not inherit (they would override the file).
fn stack_env() -> Vec<std::ffi::OsString> {
    std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| k.to_string_lossy().starts_with("SB_"))
        .collect()
}

/// The `stack` tool built beside the running program: `target/<profile>/stack` (a test binary
/// runs from `target/<profile>/deps/`). `make test`, `make bench` and `make chaos` build it with
/// the workspace's binaries.
pub fn stack_bin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("the running program's path")?;
    let dir = exe.parent().context("the program's folder")?;
    [dir, dir.parent().unwrap_or(dir)]
        .iter()
        .map(|d| d.join("stack"))
        .find(|bin| bin.is_file())
        .with_context(|| {
            format!(
                "no `stack` binary beside {}: build it (cargo build -p switchboard-stack --bin \
                 stack, with --release for a release program)",
                exe.display()
            )
        })
}

/// The `switchboard` binary next to the test binaries (`make test` builds it first).
pub fn switchboard_bin() -> PathBuf {
    let dir = std::env::current_exe()
        .expect("test binary path")
        .parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("switchboard");
    assert!(
        bin.exists(),
        "{} is missing: `make test` builds it first (cargo build --bins)",
        bin.display()
    );
    bin
}

fn tracing_subscriber_init() -> Option<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        let traces = switchboard_kit::telemetry::init(
            switchboard_kit::config::LogFormat::Text,
            &Default::default(),
            "switchboard-tests",
        );
        std::mem::forget(traces);
    }
    Some(())
}

impl TestApp {
    /// The Twilio form fields of an inbound SMS.
    pub fn sms_params(&self, from: &str, text: &str, sid: &str) -> Vec<(String, String)> {
        twilio_sms_params(&self.config.twilio.account_sid, from, text, sid)
    }

    pub fn sign(&self, params: &[(String, String)]) -> String {
        switchboard_channels::twilio::twilio_signature(
            self.config.twilio.auth_token.expose(),
            &format!("{}/webhooks/twilio/sms", self.config.gateway.public_url),
            params,
        )
    }

    /// Post the form to the Twilio webhook with the given signature header (if any).
    pub async fn post_twilio(
        &self,
        body: impl Into<reqwest::Body>,
        signature: Option<&str>,
    ) -> reqwest::Response {
        self.post_twilio_to(&self.gateway_url, body, signature)
            .await
    }

    /// [`TestApp::post_twilio`] to the gateway replica at `gateway_url` (Twilio signs the
    /// public URL, which every replica shares).
    pub async fn post_twilio_to(
        &self,
        gateway_url: &str,
        body: impl Into<reqwest::Body>,
        signature: Option<&str>,
    ) -> reqwest::Response {
        let mut req = reqwest::Client::new()
            .post(format!("{gateway_url}/webhooks/twilio/sms"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(s) = signature {
            req = req.header("X-Twilio-Signature", s);
        }
        req.send().await.expect("gateway reachable")
    }

    /// A correctly signed SMS, as Twilio would post it.
    pub async fn send_sms_with_sid(&self, from: &str, text: &str, sid: &str) -> reqwest::Response {
        let params = self.sms_params(from, text, sid);
        let signature = self.sign(&params);
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&params)
            .finish();
        self.post_twilio(body, Some(&signature)).await
    }

    pub async fn send_sms(&self, from: &str, text: &str) -> reqwest::Response {
        self.send_sms_to(&self.gateway_url, from, text).await
    }

    /// A correctly signed SMS posted to the gateway replica at `gateway_url`.
    pub async fn send_sms_to(
        &self,
        gateway_url: &str,
        from: &str,
        text: &str,
    ) -> reqwest::Response {
        let sid = format!("SM{}", uuid::Uuid::new_v4().simple());
        let params = self.sms_params(from, text, &sid);
        let signature = self.sign(&params);
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&params)
            .finish();
        self.post_twilio_to(gateway_url, body, Some(&signature))
            .await
    }

    /// Post a TextMagic inbound-message callback (JSON, as TextMagic's v2 sends it) to the URL
    /// with `token`.
    pub async fn post_textmagic(
        &self,
        token: &str,
        callback: &serde_json::Value,
    ) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!(
                "{}/webhooks/textmagic/sms/{token}",
                self.gateway_url
            ))
            .json(callback)
            .send()
            .await
            .expect("gateway reachable")
    }

    /// An SMS from `from` (digits, as TextMagic writes numbers) through TextMagic.
    pub async fn send_textmagic_sms(&self, from: &str, text: &str, id: u64) -> reqwest::Response {
        let callback = serde_json::json!({
            "id": id,
            "sender": from,
            "receiver": TEXTMAGIC_NUMBER,
            "messageTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%z").to_string(),
            "text": text,
        });
        self.post_textmagic(TEXTMAGIC_TOKEN, &callback).await
    }

    /// Post `body` to `/webhooks/generic/<source>` as a source does: JSON, signed with `secret`
    /// at `timestamp` (unix seconds) by the tests' own HMAC code.
    pub async fn post_webhook(
        &self,
        source: &str,
        secret: &str,
        timestamp: i64,
        body: &[u8],
    ) -> reqwest::Response {
        let timestamp = timestamp.to_string();
        reqwest::Client::new()
            .post(format!("{}/webhooks/generic/{source}", self.gateway_url))
            .header("content-type", "application/json")
            .header("x-switchboard-timestamp", &timestamp)
            .header(
                "x-switchboard-signature",
                webhook_signature(secret, &timestamp, body),
            )
            .body(body.to_vec())
            .send()
            .await
            .expect("gateway reachable")
    }

    /// Wait until the fake TextMagic has sent at least `n` SMS.
    pub async fn wait_for_textmagic(&self, n: usize, timeout: Duration) -> Vec<SentSms> {
        wait_for_sent("TextMagic SMS", n, timeout, || self.textmagic.sent()).await
    }

    /// Wait until the fake Twilio has sent at least `n` SMS.
    /// An SMS from `phone`, accepted and answered: waits for the `n`th SMS sent (30 s at most).
    pub async fn text_answered(&self, phone: &str, body: &str, n: usize) {
        // Accepted, or the wait below would time out without saying why.
        let accepted = self.send_sms(phone, body).await;
        assert_eq!(accepted.status(), 200, "{:?}", accepted.text().await);
        self.wait_for_sms(n, Duration::from_secs(30)).await;
    }

    pub async fn wait_for_sms(&self, n: usize, timeout: Duration) -> Vec<SentSms> {
        wait_for_sent("SMS", n, timeout, || self.twilio.sent()).await
    }

    /// Each `(from, text)` texts the agent by Twilio SMS; returns once every one is answered
    /// and the pipeline has settled.
    pub async fn text_and_settle(&self, messages: &[(&str, &str)]) {
        let before = self.twilio.sent().len();
        for (from, text) in messages {
            assert_eq!(self.send_sms(from, text).await.status(), 200);
        }
        self.wait_for_sms(before + messages.len(), Duration::from_secs(30))
            .await;
        self.settle().await;
    }

    /// Two hours pass for everything logged so far (except `keep`): the log and its marks (what
    /// the summary worker's sweep reads for quiet keys) are moved back alike.
    pub async fn log_ages_two_hours(&self, keep: Option<uuid::Uuid>) {
        sqlx::query(
            "WITH m AS (UPDATE switchboard.messages SET created_at = created_at - interval '2 hours'
                         WHERE $1::uuid IS NULL OR id <> $1 RETURNING id)
             UPDATE switchboard.message_marks k SET created_at = k.created_at - interval '2 hours'
               FROM m WHERE k.message_id = m.id",
        )
        .bind(keep)
        .execute(&self.db)
        .await
        .expect("the log moved back in time");
    }

    /// Wait until every stage has consumed and acked everything (twice in a row, so work that
    /// is being retried is not mistaken for done).
    pub async fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut quiet = 0;
        while quiet < 3 {
            assert!(Instant::now() < deadline, "pipeline did not settle in 30 s");
            let mut busy = false;
            for stage in &self.stages {
                if self.idle_stages.lock().unwrap().contains(&stage.spec.name) {
                    continue;
                }
                // A JetStream API call may time out while a cluster elects a consumer's
                // leader (a node was just killed): not settled yet, ask again (the deadline
                // bounds it).
                let pending = async {
                    let stream = self
                        .js
                        .get_stream(self.topology.stream_of(stage.spec.reads))
                        .await
                        .ok()?;
                    let mut c: jetstream::consumer::PullConsumer =
                        stream.get_consumer(stage.spec.name).await.ok()?;
                    let info = c.info().await.ok()?;
                    Some(info.num_pending + info.num_ack_pending as u64)
                };
                if pending.await != Some(0) {
                    busy = true;
                }
            }
            quiet = if busy { 0 } else { quiet + 1 };
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// How many turns `person_id`'s sessions have opened (their highest seq).
    pub async fn turns_opened(&self, person_id: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT coalesce(max(t.seq), 0) FROM switchboard.turns t
               JOIN switchboard.sessions s ON s.id = t.session_id WHERE s.person_id = $1",
        )
        .bind(person_id)
        .fetch_one(&self.db)
        .await
        .expect("read the turns")
    }

    pub async fn log_rows(&self) -> Vec<LogRow> {
        sqlx::query_as(
            "SELECT direction, message, correlation_id, session_id, person_id, processing_ms,
                    tool_calls_count, id
               FROM switchboard.messages ORDER BY id",
        )
        .fetch_all(&self.db)
        .await
        .expect("read the log")
    }

    pub async fn dead_letters(&self, stage: &str) -> Vec<DeadLetter> {
        switchboard_kit::dlq::list(&self.js, &self.topology, Some(stage), 1000)
            .await
            .expect("list dead letters")
            .into_iter()
            .map(|d| d.letter)
            .collect()
    }

    /// `switchboard dlq replay <seq>` of `stage`'s oldest dead letter, as an operator runs it
    /// once the cause is fixed.
    pub async fn replay_dead_letter(&self, stage: &str) {
        let seq = switchboard_kit::dlq::list(&self.js, &self.topology, Some(stage), 10)
            .await
            .expect("list dead letters")
            .first()
            .unwrap_or_else(|| panic!("no dead letter of {stage}"))
            .seq;
        let replayed = self
            .cli(&["dlq".as_ref(), "replay".as_ref(), seq.to_string().as_ref()])
            .await;
        assert!(replayed.status.success(), "{replayed:?}");
    }

    /// Wait until `stage` has at least one dead letter (or `timeout` passed); returns them all.
    pub async fn wait_for_dead_letters(&self, stage: &str, timeout: Duration) -> Vec<DeadLetter> {
        let deadline = Instant::now() + timeout;
        loop {
            let letters = self.dead_letters(stage).await;
            if !letters.is_empty() || Instant::now() >= deadline {
                return letters;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The gateway's Prometheus page.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.admin_url))
            .await
            .expect("gateway reachable")
            .text()
            .await
            .expect("metrics body")
    }

    /// Every `name` event on the public stream so far (`session.escalated`, …), decoded, in
    /// stream order: read from the start by a consumer of the test's own, until a second passes
    /// with nothing more.
    pub async fn public_events<T: prost::Message + Default>(&self, name: &str) -> Vec<T> {
        use futures::StreamExt as _;
        let stream = self
            .js
            .get_stream(self.topology.events_stream())
            .await
            .expect("the events stream");
        let reader = stream
            .create_consumer(jetstream::consumer::pull::Config {
                filter_subject: self.topology.event(name),
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ack_policy: jetstream::consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .expect("a reader of the events stream");
        let mut messages = reader.messages().await.expect("its messages");
        let mut events = Vec::new();
        while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(1), messages.next()).await
        {
            let m = m.expect("an event");
            events.push(T::decode(m.payload.clone()).expect("the event's protobuf"));
        }
        events
    }

    /// A rejected request must leave no trace downstream: nothing stored for the identify stage,
    /// no runner call, no SMS. Waits a little so a wrongly published message would show up.
    pub async fn assert_nothing_reached_the_pipeline(&self) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let stored = self
            .stored_on(
                &self
                    .topology
                    .filter_subject(switchboard_identify::STAGE.spec.reads),
            )
            .await;
        assert_eq!(stored, 0, "a rejected request was published");
        assert!(self.runner.calls().is_empty(), "the runner was called");
        assert!(self.twilio.sent().is_empty(), "an SMS was sent");
    }

    /// Messages stored on the work stream under `subject` (wildcards allowed).
    pub async fn stored_on(&self, subject: &str) -> u64 {
        use futures::TryStreamExt;
        let stream = self
            .js
            .get_stream(self.topology.work_stream())
            .await
            .expect("work stream");
        let mut total = 0;
        let mut subjects = stream
            .info_with_subjects(subject)
            .await
            .expect("stream subjects");
        while let Some((_, n)) = subjects.try_next().await.expect("subjects") {
            total += n as u64;
        }
        total
    }

    /// Run the `switchboard` CLI with this app's configuration file (and only that: the
    /// stack's `SB_*` variables are dropped), as an operator would.
    ///
    /// Awaited, never waited for on the thread: the app's stages run on this test's runtime,
    /// and a stage caught holding a person's erasure lock while the thread blocked on
    /// `switchboard forget` held that lock for good (a test hung in CI for 80 minutes). A
    /// CLI that does not finish in [`CLI_TIMEOUT`] fails the test with what it printed.
    pub async fn cli(&self, args: &[&std::ffi::OsStr]) -> std::process::Output {
        let mut cmd = Command::new(switchboard_bin());
        cmd.arg("--config").arg(&self.config_path).args(args);
        for k in stack_env() {
            cmd.env_remove(k);
        }
        cmd.stdin(Stdio::null()).kill_on_drop(true);
        let shown = args
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        match tokio::time::timeout(CLI_TIMEOUT, cmd.output()).await {
            Ok(out) => out.expect("run the switchboard CLI"),
            Err(_) => panic!(
                "`switchboard {shown}` did not finish in {} s",
                CLI_TIMEOUT.as_secs()
            ),
        }
    }

    /// [`TestApp::cli`] with string arguments, checked to succeed: its standard output.
    pub async fn cli_ok(&self, args: &[&str]) -> String {
        let os: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        let out = self.cli(&os).await;
        assert!(
            out.status.success(),
            "switchboard {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8 output")
    }

    /// [`TestApp::cli_ok`] of a verb run with `--json`: the one JSON document it printed.
    pub async fn cli_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.cli_ok(args).await;
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not one JSON document ({e}): {out}"))
    }

    /// Start a stage as its own worker process (`switchboard worker <name>`, the binary next to
    /// the test binary), on this app's configuration.
    pub fn spawn_worker(&self, name: &str) -> Child {
        self.spawn_worker_with_env(name, &[])
    }

    /// [`TestApp::spawn_worker`], with `env` overriding the configuration file's settings
    /// (`SB_DATABASE_URL`, say).
    pub fn spawn_worker_with_env(&self, name: &str, env: &[(&str, String)]) -> Child {
        self.runs(name);
        let mut cmd = Command::new(switchboard_bin());
        cmd.args(["worker", name]);
        // The file is the whole configuration: drop the stack's SB_* overrides of this process.
        for k in stack_env() {
            cmd.env_remove(k);
        }
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        cmd.env("SB_CONFIG", &self.config_path)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start worker process")
    }

    /// [`TestApp::spawn_worker`] whose log (stderr) the test reads and whose admin endpoints
    /// (`/metrics`) it scrapes, as an operator watches a worker.
    pub async fn spawn_logged_worker(&self, name: &str) -> LoggedWorker {
        use tokio::io::AsyncReadExt as _;
        self.runs(name);
        let admin = switchboard_kit::net::free_port("127.0.0.1").expect("a free port");
        let mut cmd = Command::new(switchboard_bin());
        cmd.args(["worker", name]);
        for k in stack_env() {
            cmd.env_remove(k);
        }
        let mut child = cmd
            .env("SB_CONFIG", &self.config_path)
            .env("SB_ADMIN__HTTP_ADDR", format!("127.0.0.1:{admin}"))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start worker process");
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut stderr = child.stderr.take().expect("piped stderr");
        let into = log.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buf[..n]);
                // Still shown, as an inherited stderr would be.
                eprint!("{text}");
                into.lock().unwrap().push_str(&text);
            }
        });
        let admin_url = format!("http://127.0.0.1:{admin}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while reqwest::get(format!("{admin_url}/healthz")).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the worker process did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        LoggedWorker {
            child,
            admin_url,
            log,
        }
    }

    /// A gateway replica as its own process (`switchboard gateway`, on this app's
    /// configuration with its own ports); its base URL once it answers `/healthz`.
    pub async fn spawn_gateway_process(&self) -> (Child, String) {
        let port = || switchboard_kit::net::free_port("127.0.0.1").expect("a free port");
        let (http, admin) = (port(), port());
        let mut cmd = Command::new(switchboard_bin());
        cmd.arg("gateway");
        for k in stack_env() {
            cmd.env_remove(k);
        }
        let child = cmd
            .env("SB_CONFIG", &self.config_path)
            .env("SB_GATEWAY__HTTP_ADDR", format!("127.0.0.1:{http}"))
            .env("SB_ADMIN__HTTP_ADDR", format!("127.0.0.1:{admin}"))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start a gateway process");
        let url = format!("http://127.0.0.1:{http}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while reqwest::get(format!("{url}/healthz")).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the gateway process did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (child, url)
    }

    /// Another gateway replica of this deployment (its own listener, sockets and mailbox
    /// follower, the same NATS and database); its base URL. It stops with the app.
    pub async fn second_gateway(&self) -> String {
        let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (routes, follower) = switchboard::gateway_routes(&self.app).expect("gateway");
        self.start(vec![
            follower,
            self.app.serve_listener(listener, routes).expect("serve"),
        ]);
        url
    }

    /// A gateway replica of this deployment that hears no mailbox announcement: its follower
    /// (the core-NATS subscription to `{p}.mailbox.>`) never runs, as when that subscription is
    /// down. What reaches its sockets and waiting requests, they read from the mailbox table
    /// themselves. Its base URL; it stops with the app.
    pub async fn gateway_missing_announcements(&self) -> String {
        let listener = switchboard_kit::net::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (routes, _follower_never_started) =
            switchboard::gateway_routes(&self.app).expect("gateway");
        self.start(vec![
            self.app.serve_listener(listener, routes).expect("serve"),
        ]);
        url
    }

    /// A new API key for `owner` with `scopes` (`switchboard api-keys create`, as an operator
    /// runs it); the key as printed.
    /// `method path` with `credential` as the bearer (an API key, a turn token), and `body` as
    /// JSON if given: the status and the JSON answer (`Null` when it is not JSON).
    pub async fn call_api(
        &self,
        credential: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut request = reqwest::Client::new()
            .request(method, format!("{}{path}", self.gateway_url))
            .bearer_auth(credential);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("gateway reachable");
        let status = response.status().as_u16();
        (
            status,
            response.json().await.unwrap_or(serde_json::Value::Null),
        )
    }

    pub async fn api_key(&self, owner: &str, scopes: &[&str]) -> String {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "api-keys".as_ref(),
            "create".as_ref(),
            "--owner".as_ref(),
            owner.as_ref(),
        ];
        for scope in scopes {
            args.push("--scope".as_ref());
            args.push(scope.as_ref());
        }
        let out = self.cli(&args).await;
        assert!(
            out.status.success(),
            "api-keys create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// `POST /api/v1/messages` with `key` and `body` (and an Idempotency-Key, if given).
    pub async fn post_api_message(
        &self,
        key: &str,
        body: serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> reqwest::Response {
        self.post_api("messages", key, body, idempotency_key).await
    }

    /// `POST /api/v1/<route>` with `key` and `body` (and an Idempotency-Key, if given).
    pub async fn post_api(
        &self,
        route: &str,
        key: &str,
        body: serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> reqwest::Response {
        self.post_api_to(&self.gateway_url, route, key, body, idempotency_key)
            .await
    }

    /// [`TestApp::post_api`] to the gateway replica at `gateway_url`.
    pub async fn post_api_to(
        &self,
        gateway_url: &str,
        route: &str,
        key: &str,
        body: serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> reqwest::Response {
        let mut request = reqwest::Client::new()
            .post(format!("{gateway_url}/api/v1/{route}"))
            .bearer_auth(key)
            .json(&body);
        if let Some(k) = idempotency_key {
            request = request.header("Idempotency-Key", k);
        }
        request.send().await.expect("gateway reachable")
    }

    /// `GET /api/v1/messages/<correlation id>` with `key`.
    pub async fn get_api_message(&self, key: &str, correlation_id: &str) -> reqwest::Response {
        reqwest::Client::new()
            .get(format!(
                "{}/api/v1/messages/{correlation_id}",
                self.gateway_url
            ))
            .bearer_auth(key)
            .send()
            .await
            .expect("gateway reachable")
    }

    /// The newest reply dispatch published (on the work stream, whether or not a deliverer
    /// took it yet) that is not one of `seen`, once there is one.
    pub async fn wait_for_reply(&self, seen: &[&Reply], timeout: Duration) -> Reply {
        use prost::Message as _;
        let deadline = Instant::now() + timeout;
        let stream = self
            .js
            .get_stream(self.topology.work_stream())
            .await
            .expect("work stream");
        loop {
            if let Ok(raw) = stream
                .get_last_raw_message_by_subject(&self.topology.reply())
                .await
            {
                let reply = Reply::decode(raw.payload).expect("a reply");
                if !seen.iter().any(|r| r.id == reply.id) {
                    return reply;
                }
            }
            assert!(Instant::now() < deadline, "no new reply within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Leave `reply`'s ledger row as a deliverer does that dies in the middle of sending part
    /// `sent_before` (0-based): it took the reply with a lease of `lease`, sent and recorded
    /// the parts before it (recording each time that the attempt at the next one started),
    /// handed that part to the provider if `provider_accepted` (through the provider's real
    /// send API), and died before recording anything more.
    pub async fn deliverer_dies_sending(
        &self,
        reply: &Reply,
        lease: Duration,
        sent_before: usize,
        provider_accepted: bool,
    ) {
        let id: uuid::Uuid = reply.id.parse().expect("reply id");
        let senders = switchboard_deliver::senders(&self.app);
        let sender = senders.get(&reply.provider).expect("the reply's provider");
        let parts = sender.split(&reply.text);
        let ledger = switchboard_deliver::DeliveryLedger::new(self.db.clone(), lease);
        let claim = ledger
            .claim(reply, id, parts.len())
            .await
            .expect("claim the reply");
        assert!(
            matches!(
                claim,
                switchboard_deliver::Claim::Send {
                    parts_sent: 0,
                    attempt: switchboard_deliver::PartAttempt::Started,
                    ..
                }
            ),
            "the dead deliverer must be the first to take the reply"
        );
        // The person has just written: a channel with a window has it open.
        let last_inbound = sender.session_window().map(|_| chrono::Utc::now());
        let send = |index: usize| {
            let part = switchboard_channels::OutboundPart::new(reply, index, &parts[index])
                .with_last_inbound(last_inbound);
            sender.send(part)
        };
        for index in 0..sent_before {
            let sid = send(index).await.expect("the provider accepts the part");
            let until = Instant::now() + lease;
            ledger
                .record_part_sent(id, &sid, index, false, until)
                .await
                .expect("record the part");
        }
        if provider_accepted {
            send(sent_before)
                .await
                .expect("the provider accepts the part");
        }
    }

    /// A deliverer dies having handed `reply`'s first part to a provider that keeps no log
    /// (Telegram, Meta's WhatsApp) before the ledger recorded it; the deliver stage, started
    /// here, takes it over. Asserts the reply ends `failed` at once (no dead letter: no retry
    /// could learn more) and returns the reason it was given.
    pub async fn a_dead_deliverers_unknowable_part_ends_the_reply(&self, reply: &Reply) -> String {
        self.deliverer_dies_sending(reply, Duration::from_secs(1), 0, true)
            .await;
        self.start_stage("deliver");
        let (status, _) = self.wait_for_delivery(reply, Duration::from_secs(90)).await;
        self.settle().await;
        assert_eq!(status, "failed", "ends failed, with its reason");
        assert!(
            self.dead_letters("deliver").await.is_empty(),
            "ended at once, not given up on after retries"
        );
        let error: Option<String> =
            sqlx::query_scalar("SELECT last_error FROM switchboard.deliveries WHERE reply_id = $1")
                .bind(reply.id.parse::<uuid::Uuid>().expect("reply id"))
                .fetch_one(&self.db)
                .await
                .expect("the reply's ledger row");
        error.unwrap_or_default()
    }

    /// Deliver `reply` now, as a live deliverer does, outside the deliver stage's consumer (the
    /// reply stays on the stream for the stage, which then finds it sent).
    pub async fn deliver_directly(&self, reply: &Reply) {
        let stage = switchboard_deliver::DeliverStage::new(
            switchboard_deliver::DeliveryLedger::new(
                self.db.clone(),
                switchboard_deliver::DELIVERY_LEASE,
            ),
            switchboard_deliver::senders(&self.app),
            self.topology.clone(),
        );
        let attempt = switchboard_kit::Attempt {
            subject: self.topology.reply(),
            delivered: 1,
            stream_sequence: 1,
            correlation_id: reply.correlation_id.clone(),
            ..Default::default()
        };
        stage
            .deliver_one(reply.clone(), &attempt)
            .await
            .expect("the reply is delivered");
    }

    /// The ledger's status and provider ids for `reply` once it is settled (sent or failed).
    pub async fn wait_for_delivery(
        &self,
        reply: &Reply,
        timeout: Duration,
    ) -> (String, Vec<String>) {
        let id: uuid::Uuid = reply.id.parse().expect("reply id");
        let deadline = Instant::now() + timeout;
        loop {
            let row: Option<(String, Vec<String>)> = sqlx::query_as(
                "SELECT status, provider_message_ids FROM switchboard.deliveries WHERE reply_id = $1",
            )
            .bind(id)
            .fetch_optional(&self.db)
            .await
            .expect("read the ledger");
            if let Some(row) = row.filter(|(status, _)| status != "pending") {
                return row;
            }
            assert!(
                Instant::now() < deadline,
                "reply {} not settled within {timeout:?}",
                reply.id
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Start a stage in this process that was left out of [`AppOptions::in_process`].
    pub fn start_stage(&self, name: &str) {
        let stage = stages::select_from(&self.stages, &[name]).expect("a known stage");
        self.runs(name);
        self.start(stages::tasks(&self.app, &stage));
    }

    /// `stage` runs from now on (in this process or as a worker process).
    fn runs(&self, stage: &str) {
        self.idle_stages.lock().unwrap().retain(|s| *s != stage);
    }

    /// The process's wiring (database, JetStream, topology, shutdown), to run more tasks in it.
    pub fn app(&self) -> &App {
        &self.app
    }

    /// Run `tasks` in this app (e.g. a stage started late, or a test's own stage) until
    /// [`TestApp::shutdown`].
    pub fn start(&self, tasks: Vec<switchboard_kit::startup::Task>) {
        for t in tasks {
            tokio::spawn(t);
        }
    }

    pub async fn shutdown(mut self) {
        self.app.shutdown.trigger();
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.handle).await;
        let _ = std::fs::remove_file(&self.config_path);
    }
}

/// A stage's handler run as the runtime runs one message that must wait
/// ([`switchboard_kit::StageError::Wait`]): parked until woken (or for its longest wait), then
/// run again; the first outcome that is not such a wait.
pub async fn handle_through_waits<S: switchboard_kit::Stage>(
    stage: &S,
    input: S::Input,
    attempt: &switchboard_kit::Attempt,
) -> switchboard_kit::Outcome
where
    S::Input: Clone,
{
    let mut attempt = attempt.clone();
    loop {
        match stage.handle(input.clone(), &attempt).await {
            Err(switchboard_kit::StageError::Wait { at_most, wake, .. }) => {
                let _ = tokio::time::timeout(at_most, wake.fired()).await;
                attempt.waits += 1;
            }
            other => return other,
        }
    }
}
