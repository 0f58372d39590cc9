//! Where Postgres spends its time, by worker and statement: `bench --profile-statements`.
//!
//! The stack's Postgres 18 has no `pg_stat_statements` (the registry's server carries no
//! contrib modules), so the profile is read from the server's own log: every statement logged
//! with its duration (`log_min_duration_statement = 0`) and the connection's
//! `application_name` (`%a`, which the workers set to `switchboard-<worker>`). A run so logged
//! is slower: this is a profile (shares of time), not a measurement of speed.
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The Postgres settings a profiled run needs. The prefix ends with `|` so the application's
/// name (which may hold spaces) is found without guessing.
pub const PG_CONF: &str = "log_min_duration_statement = 0
log_line_prefix = '%m [%p] %a|'
log_parameter_max_length = 0
log_parameter_max_length_on_error = 0";

/// A place in the server's log: the profile covers what was written between two marks.
#[derive(Debug, Clone)]
pub struct LogMark {
    path: PathBuf,
    offset: u64,
}

impl LogMark {
    /// The log's end now (0 when it cannot be read: the span then starts at its beginning).
    pub fn now(path: &Path) -> LogMark {
        let offset = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        LogMark {
            path: path.to_path_buf(),
            offset,
        }
    }

    /// The log between `self` and `end`.
    pub fn read_to(&self, end: &LogMark) -> std::io::Result<String> {
        let mut file = std::fs::File::open(&self.path)?;
        file.seek(SeekFrom::Start(self.offset))?;
        let mut bytes = Vec::new();
        file.take(end.offset.saturating_sub(self.offset))
            .read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// One statement's share: the time of its parse, bind and execute steps summed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatementCost {
    pub application: String,
    /// The statement with its whitespace collapsed.
    pub statement: String,
    /// Executions (a parse or bind alone is not one).
    pub calls: u64,
    pub total_ms: f64,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Profile {
    /// Turns the span completed, to put each cost per turn.
    pub turns: u64,
    pub total_ms: f64,
    /// By statement, the costliest first.
    pub statements: Vec<StatementCost>,
}

/// One logged step: `parse`, `bind`, `execute` (extended protocol) or `statement` (simple).
struct Step<'a> {
    application: &'a str,
    ms: f64,
    executes: bool,
    first_line: &'a str,
}

/// `… [pid] app|LOG:  duration: 0.123 ms  execute sqlx_s_4: SELECT …`
fn step(line: &str) -> Option<Step<'_>> {
    let (head, rest) = line.split_once("|LOG:  duration: ")?;
    let application = head.split_once("] ").map_or("", |(_, a)| a);
    let (ms, rest) = rest.split_once(" ms  ")?;
    let ms = ms.trim().parse().ok()?;
    let (kind, text) = rest.split_once(": ")?;
    let executes = kind.starts_with("execute") || kind == "statement";
    Some(Step {
        application,
        ms,
        executes,
        first_line: text,
    })
}

/// The profile of `log` (a span of the server's log) for the connections whose application
/// name starts with `applications` (the product's workers, not the bench's own reads).
pub fn profile(log: &str, applications: &str, turns: u64) -> Profile {
    let mut by_key: HashMap<(String, String), StatementCost> = HashMap::new();
    let mut lines = log.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(step) = step(line) else { continue };
        // A statement of several lines goes on in lines that start with a tab.
        let mut text = step.first_line.to_string();
        while let Some(next) = lines.peek().filter(|l| l.starts_with('\t')) {
            text.push(' ');
            text.push_str(next.trim());
            lines.next();
        }
        if !step.application.starts_with(applications) {
            continue;
        }
        let statement = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let key = (step.application.to_string(), statement);
        let cost = by_key.entry(key.clone()).or_insert_with(|| StatementCost {
            application: key.0,
            statement: key.1,
            calls: 0,
            total_ms: 0.0,
        });
        cost.total_ms += step.ms;
        cost.calls += u64::from(step.executes);
    }
    let mut statements: Vec<StatementCost> = by_key.into_values().collect();
    statements.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    Profile {
        turns,
        total_ms: statements.iter().map(|s| s.total_ms).sum(),
        statements,
    }
}

impl Profile {
    /// Time by application, the costliest first.
    pub fn by_application(&self) -> Vec<(String, f64)> {
        let mut by: HashMap<&str, f64> = HashMap::new();
        for s in &self.statements {
            *by.entry(&s.application).or_default() += s.total_ms;
        }
        let mut by: Vec<(String, f64)> = by.into_iter().map(|(a, t)| (a.to_string(), t)).collect();
        by.sort_by(|a, b| b.1.total_cmp(&a.1));
        by
    }

    /// The report: time by worker, then the `top` costliest statements, each as a share of
    /// the whole, µs and calls per turn.
    pub fn render(&self, top: usize) -> String {
        let turns = self.turns.max(1) as f64;
        let share = |ms: f64| 100.0 * ms / self.total_ms.max(f64::MIN_POSITIVE);
        let mut out = format!(
            "statement time {:.0} ms over {} turns: {:.0} µs a turn (logged durations, server side)\n\nby worker:\n",
            self.total_ms,
            self.turns,
            1000.0 * self.total_ms / turns
        );
        for (application, ms) in self.by_application() {
            out.push_str(&format!(
                "  {:5.1} %  {:7.0} µs/turn  {application}\n",
                share(ms),
                1000.0 * ms / turns
            ));
        }
        out.push_str("\nby statement:\n");
        for s in self.statements.iter().take(top) {
            let text: String = s.statement.chars().take(150).collect();
            out.push_str(&format!(
                "  {:5.1} %  {:6.0} µs/turn  {:5.2} calls/turn  {}  {text}\n",
                share(s.total_ms),
                1000.0 * s.total_ms / turns,
                s.calls as f64 / turns,
                s.application
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
2026-11-27 07:53:00.100 UTC [41] switchboard-dispatch|LOG:  duration: 0.020 ms  parse sqlx_s_1: SELECT a
\t  FROM t WHERE x = $1
2026-11-27 07:53:00.101 UTC [41] switchboard-dispatch|LOG:  duration: 0.030 ms  bind sqlx_s_1: SELECT a
\t  FROM t WHERE x = $1
2026-11-27 07:53:00.102 UTC [41] switchboard-dispatch|LOG:  duration: 0.250 ms  execute sqlx_s_1: SELECT a
\t  FROM t WHERE x = $1
2026-11-27 07:53:00.103 UTC [42] switchboard-session|LOG:  duration: 1.000 ms  statement: COMMIT
2026-11-27 07:53:00.104 UTC [42] switchboard-session|LOG:  duration: 0.500 ms  statement: COMMIT
2026-11-27 07:53:00.105 UTC [43] bench|LOG:  duration: 9.000 ms  statement: SELECT * FROM pg_stat_database
2026-11-27 07:53:00.106 UTC [44] switchboard-dispatch|LOG:  checkpoint starting: time
";

    #[test]
    fn time_is_summed_by_worker_and_statement_and_the_bench_s_own_reads_left_out() {
        let p = profile(LOG, "switchboard-", 2);
        assert_eq!(p.statements.len(), 2);
        assert_eq!(p.statements[0].application, "switchboard-session");
        assert_eq!(p.statements[0].statement, "COMMIT");
        assert_eq!(p.statements[0].calls, 2);
        assert!((p.statements[0].total_ms - 1.5).abs() < 1e-9);
        // Parse, bind and execute are one statement's time; only the execute is a call.
        assert_eq!(p.statements[1].statement, "SELECT a FROM t WHERE x = $1");
        assert_eq!(p.statements[1].calls, 1);
        assert!((p.statements[1].total_ms - 0.3).abs() < 1e-9);
        assert!((p.total_ms - 1.8).abs() < 1e-9);
        let report = p.render(10);
        assert!(report.contains("900 µs a turn"), "{report}");
        assert!(report.contains("switchboard-session"), "{report}");
    }

    #[test]
    fn a_span_is_read_between_two_marks() {
        let path = std::env::temp_dir().join(format!("sb-profile-{}.log", std::process::id()));
        std::fs::write(&path, "before\n").unwrap();
        let start = LogMark::now(&path);
        std::fs::write(&path, "before\nduring\n").unwrap();
        let end = LogMark::now(&path);
        std::fs::write(&path, "before\nduring\nafter\n").unwrap();
        assert_eq!(start.read_to(&end).unwrap(), "during\n");
        std::fs::remove_file(&path).unwrap();
    }
}
