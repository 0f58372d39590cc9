//! Switchboard's processes: every stage wired together (`switchboard up`), one worker's stages
//! (`switchboard worker <name>`), the gateway alone (`switchboard gateway`), plus the demo
//! runner and outbox.
pub mod chat;
pub mod demo;
pub mod people;
pub mod stages;

use anyhow::Context as _;
use switchboard_kit::startup::{App, STARTUP_WAIT};

/// Who runs the CLI, for the audit trail of identity links when `--by` is not given: the first
/// of `USER`, `LOGNAME`, `USERNAME` that is set (cron and some shells set only one of them).
pub fn os_user() -> String {
    ["USER", "LOGNAME", "USERNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

/// The gateway's public routes (every channel's webhook, the chat socket, the REST API, the
/// health checks) and the task that hands replies to the sockets and API requests it holds.
pub fn gateway_routes(app: &App) -> anyhow::Result<(axum::Router, switchboard_kit::startup::Task)> {
    let state = switchboard_gateway::GatewayState::new(app)?;
    let follower = state.follower();
    let mut routes = switchboard_gateway::router(state)
        .merge(switchboard_kit::admin::health_router(app.readiness()));
    // The demo runner and outboxes, on every gateway that has them on (`switchboard up`, and
    // `switchboard gateway` in deploy/compose.yaml).
    if app.config.demo.enabled {
        routes = routes.merge(demo::router(&app.config));
        tracing::info!(
            "demo runner at /demo/runner, demo Twilio and TextMagic outbox at /demo/outbox, the chat widget on /demo/widget"
        );
    }
    Ok((routes, follower))
}

/// `/healthz`, `/readyz` and `/metrics` on `admin.http_addr`.
pub async fn admin_task(app: &App) -> anyhow::Result<switchboard_kit::startup::Task> {
    let admin = switchboard_kit::admin::router(app.readiness());
    app.serve_http(&app.config.admin.http_addr, admin)
        .await
        .context("serving the admin endpoints")
}

/// The ops console's routes (`/console`, for the admin address) over `app`.
pub fn console_router(app: &App) -> anyhow::Result<axum::Router> {
    let state = switchboard_gateway::GatewayState::new(app)?;
    Ok(switchboard_gateway::console::router(state, stages::ALL))
}

/// The admin address of a process that runs the gateway: the health checks, `/metrics` and
/// the ops console (`/console`).
pub async fn gateway_admin_task(app: &App) -> anyhow::Result<switchboard_kit::startup::Task> {
    let admin = switchboard_kit::admin::router(app.readiness()).merge(console_router(app)?);
    app.serve_http(&app.config.admin.http_addr, admin)
        .await
        .context("serving the admin endpoints and the console")
}

/// A process running the stages `names` stand for (stage or worker names): connect, migrate,
/// apply the whole topology, serve the admin endpoints, drain on SIGTERM.
pub async fn run_worker(config: switchboard_kit::Config, names: &[String]) -> anyhow::Result<()> {
    let selected = stages::select(names)?;
    let label = names.join("+");
    let app = App::start(config, &label, stages::ALL, STARTUP_WAIT).await?;
    app.shutdown.trigger_on_signals();
    let mut tasks = stages::tasks(&app, &selected);
    tasks.push(admin_task(&app).await?);
    tracing::info!(
        stages = %selected.iter().map(|r| r.spec.name).collect::<Vec<_>>().join(", "),
        "worker is up"
    );
    app.run(tasks).await
}

/// A process running the gateway alone.
pub async fn run_gateway(config: switchboard_kit::Config) -> anyhow::Result<()> {
    let app = App::start(config.for_gateway(), "gateway", stages::ALL, STARTUP_WAIT).await?;
    app.shutdown.trigger_on_signals();
    let (routes, follower) = gateway_routes(&app)?;
    let serve = app
        .serve_http(&app.config.gateway.http_addr, routes)
        .await?;
    let admin = gateway_admin_task(&app).await?;
    app.run(vec![serve, follower, admin]).await
}
