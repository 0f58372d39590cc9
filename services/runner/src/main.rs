use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The Switchboard runner: runs an agent's engine CLI for each turn Switchboard sends.
#[derive(Parser)]
struct Args {
    /// runner.toml
    #[arg(long, env = "SB_RUNNER_CONFIG", default_value = "runner.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// (Started by the runner itself.) Run the engine of one run folder to its end, recording
    /// its exit, so that it outlives a runner crash.
    #[command(hide = true)]
    Supervise { run_dir: PathBuf },
    /// An engine for trying the runner without an agent (deploy/compose's runner): prints
    /// `{"text", "session_id"}`, the text quoting the prompt's last line. The prompt is read
    /// from `--message-file` (as the runner's `prompt_via = "file"` gives it), or stdin.
    DemoEngine {
        #[arg(long)]
        session_id: String,
        #[arg(long, conflicts_with = "message_file")]
        message: Option<String>,
        #[arg(long)]
        message_file: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Supervise { run_dir }) = args.command {
        // No async runtime and no threads of its own but the output copiers: the engine's
        // parent-death signal follows the thread that started it, which is this one.
        let code = switchboard_runner::supervisor::supervise(&run_dir)?;
        std::process::exit(code);
    }
    if let Some(Command::DemoEngine {
        session_id,
        message,
        message_file,
    }) = args.command
    {
        let message = match (message, message_file) {
            (Some(m), _) => m,
            (None, Some(path)) => std::fs::read_to_string(path)?,
            (None, None) => std::io::read_to_string(std::io::stdin())?,
        };
        println!(
            "{}",
            switchboard_runner::engine::demo_answer(&session_id, &message)
        );
        return Ok(());
    }
    let config = switchboard_runner::RunnerConfig::load(&args.config)?;
    let _traces = switchboard_trace::init("info", false, &config.telemetry, "switchboard-runner")?;
    tokio::runtime::Runtime::new()?.block_on(switchboard_runner::serve(config))
}
