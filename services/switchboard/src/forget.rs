//! `switchboard forget <person> [--json] [--no-wait] [--timeout <s>]`: erase a person completely
//! (`switchboard_forget`). The rows go in this command's transaction; the stream sweep is the
//! forget worker's job, which the command follows until it is done (printing each change of
//! status), then prints what was removed per kind. `--no-wait` prints the job as it started.
//! Run again for a person erased before, it follows (or, failed, retries) that job.
use std::time::{Duration, Instant};

use switchboard_forget::{Begun, ErasureJob, ForgetError, JobStatus, forget, job};
use switchboard_kit::Config;
use switchboard_kit::startup::App;

/// How often the job is read while waiting.
const POLL: Duration = Duration::from_millis(250);

pub struct Options {
    pub json: bool,
    pub no_wait: bool,
    pub timeout: Duration,
}

pub async fn run(config: Config, person: &str, options: Options) -> anyhow::Result<()> {
    let app = App::connect(config, "cli").await?;
    let begun = match forget(&app.db, &app.js, &app.topology, person, "cli").await {
        Ok(b) => b,
        Err(e @ ForgetError::Unknown(_)) => anyhow::bail!("{e}"),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("forgetting {person:?}"))),
    };
    if !options.json {
        let what = if begun.started {
            "erasing"
        } else {
            "erased before, by"
        };
        eprintln!(
            "{person}: {what} job {} ({})",
            begun.job.job_id, begun.job.status
        );
    }
    if options.no_wait {
        return print(&begun, options.json);
    }
    let job = wait(&app, begun.job.clone(), options.json, options.timeout).await?;
    let done = Begun { job, ..begun };
    print(&done, options.json)?;
    match done.job.status {
        JobStatus::Done => Ok(()),
        JobStatus::Failed => anyhow::bail!(
            "the erasure failed: {} delete(s) kept failing (run `switchboard forget {person}` again to retry)",
            done.job.failures.len()
        ),
        status => anyhow::bail!(
            "the erasure is still {status} after {} s: it goes on in the forget worker \
             (`switchboard worker forget`); run the command again to follow it",
            options.timeout.as_secs()
        ),
    }
}

/// Follow `job` until it is over or `timeout` has passed; each change of status is said on
/// standard error (unless `quiet`).
async fn wait(
    app: &App,
    mut job: ErasureJob,
    quiet: bool,
    timeout: Duration,
) -> anyhow::Result<ErasureJob> {
    let deadline = Instant::now() + timeout;
    while !job.status.is_final() && Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        let now = job::load(&app.db, job.job_id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("job {} is gone", job.job_id))?;
        if now.status != job.status && !quiet {
            eprintln!("job {}: {} ({} removed)", now.job_id, now.status, now.total);
        }
        job = now;
    }
    Ok(job)
}

fn print(begun: &Begun, json: bool) -> anyhow::Result<()> {
    let job = &begun.job;
    if json {
        let mut body = serde_json::to_value(begun)?;
        body["status_url"] = job.status_url().into();
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    if job.status == JobStatus::Done {
        println!(
            "forgot {} at {}: {} removed (job {})",
            begun.person_id,
            job.forgotten_at.to_rfc3339(),
            job.total,
            job.job_id
        );
    } else {
        println!(
            "{}: job {} {} (rows erased at {}): {} removed so far",
            begun.person_id,
            job.job_id,
            job.status,
            job.forgotten_at.to_rfc3339(),
            job.total
        );
    }
    for (kind, n) in job.removed.iter().filter(|(_, n)| **n > 0) {
        println!("  {kind:<22} {n:>8}");
    }
    for f in &job.failures {
        println!("  not deleted: {} at {}: {}", f.what, f.place, f.error);
    }
    Ok(())
}
