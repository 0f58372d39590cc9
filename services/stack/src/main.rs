//! `stack`: the local NATS JetStream + PostgreSQL 18 (pgvector) stack, for development and
//! tests (deploy/local/README.md).
//!
//! `up`, `env` and `rotate` print `export ...` lines on stdout; every other message goes to
//! stderr, so `eval "$(stack up test 24222 25432)"` works. Exit status: 0, 1 on an error, 2 on
//! wrong arguments, and for `status` 3 when the stack is not running and ready.
use std::io::Write as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use switchboard_stack::commands::{self, Server};
use switchboard_stack::layout::Settings;
use switchboard_stack::{Error, sys};

#[derive(Debug, Parser)]
#[command(
    name = "stack",
    about = "The local stack: NATS JetStream and PostgreSQL 18 + pgvector on loopback (deploy/local/README.md)",
    after_help = "Environment: SB_STACK_DIR (state root, default <repo>/.stack), SB_STACK_FAST=1 \
        (Postgres without fsync), SB_STACK_PG_CONF (more Postgres settings), SB_STACK_TIMEOUT \
        (seconds, default 30), SB_NATS_MONITOR_PORT, SB_STACK_PG_USER (as root), SB_PYTHON, \
        SB_STACK_NATS_PREFIXES, SB_STACK_ANALYTICS_PREFIX, SB_STACK_NATS_CLUSTER=3|5 (up: NATS \
        as a JetStream cluster of that many nodes; node i on the ports + i - 1)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand, PartialEq, Eq)]
enum Command {
    /// Start the stack's servers (generating its credentials on the first start) and print the
    /// export lines.
    Up {
        name: String,
        nats_port: String,
        pg_port: String,
        /// Default: SB_NATS_MONITOR_PORT, else nats_port + 1000.
        nats_monitor_port: Option<String>,
    },
    /// Stop both servers; the data is kept.
    #[command(alias = "stop")]
    Down { name: String },
    /// What runs; exit status 0 if both servers run and are ready, else 3.
    Status { name: String },
    /// Print the export lines (they hold the passwords).
    Env { name: String },
    /// Down, and delete the name's data and credentials.
    Destroy { name: String },
    /// Stop one server and start it again on the same ports and data.
    Restart {
        name: String,
        /// nats (every NATS node), nats-<i> (NATS node i of a cluster) or pg.
        #[arg(value_name = "nats|nats-<i>|pg")]
        server: Server,
    },
    /// SIGKILL one server (Postgres: the postmaster and every backend; nats: every node) and
    /// start it again.
    Crash {
        name: String,
        /// nats (every NATS node), nats-<i> (NATS node i of a cluster) or pg.
        #[arg(value_name = "nats|nats-<i>|pg")]
        server: Server,
    },
    /// New passwords (restarts the servers of a running stack); prints the export lines.
    Rotate { name: String },
}

/// Run one command; the exit status when it did not fail.
fn run(command: Command) -> anyhow::Result<ExitCode> {
    let settings = Settings::from_env()?;
    let print = |text: String| -> anyhow::Result<ExitCode> {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        Ok(ExitCode::SUCCESS)
    };
    match command {
        Command::Up {
            name,
            nats_port,
            pg_port,
            nats_monitor_port,
        } => print(commands::up(
            &settings,
            &name,
            &nats_port,
            &pg_port,
            nats_monitor_port.as_deref(),
        )?),
        Command::Down { name } => {
            commands::down(&settings, &name)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { name } => {
            let ready = commands::status(&settings, &name, &mut std::io::stdout().lock())?;
            Ok(if ready {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            })
        }
        Command::Env { name } => print(commands::env(&settings, &name)?),
        Command::Destroy { name } => {
            commands::destroy(&settings, &name)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Restart { name, server } => {
            commands::restart(&settings, &name, server)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Crash { name, server } => {
            commands::crash(&settings, &name, server)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Rotate { name } => print(commands::rotate(&settings, &name)?),
    }
}

fn main() -> ExitCode {
    sys::set_umask();
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            let code = match e.downcast_ref::<Error>() {
                Some(Error::Reported) => 1,
                Some(err) => {
                    eprintln!("stack: ERROR: {err}");
                    err.exit_code()
                }
                None => {
                    eprintln!("stack: ERROR: {e:#}");
                    1
                }
            };
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("stack").chain(args.iter().copied())).map(|c| c.command)
    }

    #[test]
    fn the_verbs_take_the_scripts_arguments() {
        assert_eq!(
            parse(&["up", "test", "24222", "25432"]).unwrap(),
            Command::Up {
                name: "test".into(),
                nats_port: "24222".into(),
                pg_port: "25432".into(),
                nats_monitor_port: None
            }
        );
        assert_eq!(
            parse(&["up", "t", "1", "2", "3"]).unwrap(),
            Command::Up {
                name: "t".into(),
                nats_port: "1".into(),
                pg_port: "2".into(),
                nats_monitor_port: Some("3".into())
            }
        );
        assert_eq!(
            parse(&["stop", "run"]).unwrap(),
            Command::Down { name: "run".into() }
        );
        assert_eq!(
            parse(&["crash", "x", "pg"]).unwrap(),
            Command::Crash {
                name: "x".into(),
                server: Server::Pg
            }
        );
        assert_eq!(
            parse(&["restart", "x", "nats"]).unwrap(),
            Command::Restart {
                name: "x".into(),
                server: Server::Nats
            }
        );
        assert_eq!(
            parse(&["crash", "chaos", "nats-2"]).unwrap(),
            Command::Crash {
                name: "chaos".into(),
                server: Server::NatsNode(2)
            }
        );
        assert_eq!(
            parse(&["restart", "x", "nats-1"]).unwrap(),
            Command::Restart {
                name: "x".into(),
                server: Server::NatsNode(1)
            }
        );
        for verb in ["status", "env", "destroy", "rotate", "down"] {
            assert!(parse(&[verb, "x"]).is_ok(), "{verb}");
        }
    }

    #[test]
    fn wrong_arguments_are_usage_errors() {
        for args in [
            &[][..],
            &["up", "test", "24222"],
            &["up", "t", "1", "2", "3", "4"],
            &["restart", "x", "redis"],
            &["crash", "x", "nats-0"],
            &["crash", "x", "nats-"],
            &["crash", "x", "nats-x"],
            &["crash", "x", "nats-+2"],
            &["restart", "x", "NATS"],
            &["crash", "x"],
            &["status"],
            &["env", "a", "b"],
            &["launch", "x"],
        ] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
        }
    }
}
