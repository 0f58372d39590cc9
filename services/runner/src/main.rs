use std::path::PathBuf;

use clap::Parser;

/// The Switchboard runner: runs an agent's engine CLI for each turn Switchboard sends.
#[derive(Parser)]
struct Args {
    /// runner.toml
    #[arg(long, env = "SB_RUNNER_CONFIG", default_value = "runner.toml")]
    config: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = switchboard_runner::RunnerConfig::load(&args.config)?;
    switchboard_runner::serve(config).await
}
