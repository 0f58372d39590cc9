//! The NATS server of a stack: its configuration (loopback, JetStream, the two users and their
//! permissions; for a cluster node also its `cluster {}` block, from [`crate::nats_cluster`]).
//! Starting, checking and stopping the servers is [`crate::nats_nodes`]'.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::credentials::{Credentials, NATS_APP_USER, NATS_RO_USER};
use crate::nats_cluster::{ClusterNode, cluster_block, server_name};
use crate::readers::ServiceImport;
use crate::{Error, Result};

/// Changes whenever the subjects below do, so that `up` restarts a NATS that runs with the old
/// ones (the settings line records it).
pub const PERMISSIONS_VERSION: u32 = 6;

/// The product's NATS account: its users, its streams (JetStream keeps them under
/// `<store_dir>/jetstream/SWITCHBOARD/`) and what it exports to the others.
pub const PRODUCT_ACCOUNT: &str = "SWITCHBOARD";
/// The `analytics` user's account: it imports the public events and nothing else.
pub const ANALYTICS_ACCOUNT: &str = "ANALYTICS";

/// A subject token: letters, digits, '_' and '-'.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The prefixes (`SB_STACK_NATS_PREFIXES`, space-separated; empty: `*`, any) and the analytics
/// prefix (empty: `sb`), checked.
fn checked_prefixes<'a>(prefixes: &'a str, analytics: &'a str) -> Result<(Vec<&'a str>, &'a str)> {
    let prefixes = if prefixes.is_empty() { "*" } else { prefixes };
    let list: Vec<&str> = prefixes.split_whitespace().collect();
    if list.is_empty() {
        return Err(Error::Invalid("SB_STACK_NATS_PREFIXES is empty".into()));
    }
    if let Some(bad) = list.iter().find(|p| **p != "*" && !is_token(p)) {
        return Err(Error::Invalid(format!(
            "SB_STACK_NATS_PREFIXES: '{bad}' is not a subject token (or '*')"
        )));
    }
    let analytics = if analytics.is_empty() {
        "sb"
    } else {
        analytics
    };
    if !is_token(analytics) {
        return Err(Error::Invalid(format!(
            "SB_STACK_ANALYTICS_PREFIX: '{analytics}' is not a subject token"
        )));
    }
    Ok((list, analytics))
}

/// Checks the prefixes before anything is stopped or written.
pub fn check_prefixes(prefixes: &str, analytics: &str) -> Result<()> {
    checked_prefixes(prefixes, analytics).map(drop)
}

/// The line that identifies the credentials and permissions a config was written with.
pub fn settings_line(fingerprint: &str, prefixes: &str, analytics: &str) -> String {
    format!(
        "# settings: credentials {fingerprint}, prefixes {}, analytics {}, permissions v{PERMISSIONS_VERSION}",
        if prefixes.is_empty() { "*" } else { prefixes },
        if analytics.is_empty() {
            "sb"
        } else {
            analytics
        },
    )
}

/// A NATS config array of quoted strings.
fn quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

/// What a stack's nats.conf is made of.
pub struct ConfInput<'a> {
    pub name: &'a str,
    pub nats_port: u16,
    pub monitor_port: u16,
    pub pid_file: &'a Path,
    pub store_dir: &'a Path,
    pub cred_dir: &'a Path,
    pub credentials: &'a Credentials,
    pub fingerprint: &'a str,
    /// As given (`SB_STACK_NATS_PREFIXES`; empty: any).
    pub prefixes: &'a str,
    /// As given (`SB_STACK_ANALYTICS_PREFIX`; empty: sb).
    pub analytics: &'a str,
    /// `SB_STACK_NATS_SYNC=always`: fsync every JetStream write (`sync_interval: always`).
    pub sync_always: bool,
    /// The event readers (`switchboard readers add`), after the two users.
    pub readers: &'a [crate::readers::Reader],
}

/// The accounts and users of credentials/secrets, each user in an account of its own:
///
/// - `switchboard`, the product, in account `SWITCHBOARD`: its subjects under each prefix, the
///   JetStream and key-value APIs, reply inboxes; its streams live in this account;
/// - `analytics`, read-only, in account `ANALYTICS`: the public event stream of the analytics
///   prefix, live (subscribe `<prefix>.events.>`, a stream import) or by sequence
///   (STREAM.MSG.GET / DIRECT.GET on `<PREFIX>_EVENTS`, service imports under
///   [`crate::readers::EVENTS_API_PREFIX`]); replies on its own inbox prefix
///   `_INBOX_analytics`. It may not create consumers: a push consumer's deliver subject is not
///   checked against its creator's permissions (nats-server issue 8274);
/// - each event reader in an account of its own ([`crate::readers`]).
///
/// Why accounts: a JetStream request's reply subject is the client's choice and the server
/// answers there on the stream's or consumer's behalf, so a read-only user in the product's
/// account could have messages delivered into the work subjects (reply `sb.identified`), which
/// publish permissions cannot stop. The answer to an imported request goes back to the
/// requester's own account, where no product subject or stream exists.
pub fn authorization(c: &ConfInput<'_>) -> Result<String> {
    let (prefixes, ro) = checked_prefixes(c.prefixes, c.analytics)?;
    let mut publish: Vec<String> = Vec::new();
    for p in &prefixes {
        for s in [
            "in.>",
            "identified",
            "identified.>",
            "turn.>",
            "reply",
            "forget",
            "events.>",
            "dlq.>",
            "mailbox.>",
        ] {
            publish.push(format!("{p}.{s}"));
        }
    }
    let mut subscribe = publish.clone();
    subscribe.push("_INBOX.>".into());
    // $JS.SNAPSHOT.>: a stream snapshot's chunk acks and a restore's chunks (`switchboard
    // backup`/`restore`; the user may already manage streams through $JS.API.>).
    publish.extend(
        [
            "$JS.API.>",
            "$JS.ACK.>",
            "$JS.FC.>",
            "$JS.SNAPSHOT.>",
            "$KV.>",
            "_INBOX.>",
        ]
        .map(String::from),
    );
    let stream: String = ro
        .chars()
        .map(|ch| {
            let ch = ch.to_ascii_uppercase();
            if ch.is_ascii_uppercase() || ch.is_ascii_digit() {
                ch
            } else {
                '_'
            }
        })
        .collect::<String>()
        + "_EVENTS";
    let ro_imports = [
        ServiceImport::api(&format!("STREAM.INFO.{stream}"), false),
        ServiceImport::api(&format!("STREAM.MSG.GET.{stream}"), false),
        // A direct get may answer a batch request with several messages.
        ServiceImport::api(&format!("DIRECT.GET.{stream}"), true),
        ServiceImport::api(&format!("DIRECT.GET.{stream}.>"), true),
    ];
    let ro_events = format!("{ro}.events.>");
    let ro_publish: Vec<String> = ro_imports
        .iter()
        .map(|i| i.local_subject().to_string())
        .collect();
    let ro_subscribe = [ro_events.clone(), format!("_INBOX_{NATS_RO_USER}.>")];

    // The product's exports: each service once, with every account that imports it.
    let mut services: BTreeMap<String, (bool, Vec<String>)> = BTreeMap::new();
    let mut export = |i: &ServiceImport, account: String| {
        let entry = services
            .entry(i.subject.clone())
            .or_insert((i.streamed, Vec::new()));
        if !entry.1.contains(&account) {
            entry.1.push(account);
        }
    };
    for i in &ro_imports {
        export(i, ANALYTICS_ACCOUNT.to_string());
    }
    for r in c.readers {
        for i in r.imports() {
            export(&i, r.account());
        }
    }
    let mut exports =
        format!("      {{ stream: \"{ro_events}\", accounts: [\"{ANALYTICS_ACCOUNT}\"] }}\n");
    for (subject, (streamed, accounts)) in &services {
        let _ = writeln!(
            exports,
            "      {{ service: \"{subject}\"{}, accounts: {} }}",
            if *streamed {
                ", response_type: stream"
            } else {
                ""
            },
            quoted_list(accounts)
        );
    }
    let mut ro_import_entries: String = ro_imports
        .iter()
        .map(|i| format!("      {}\n", i.import_entry(PRODUCT_ACCOUNT)))
        .collect();
    let _ = writeln!(
        ro_import_entries,
        "      {{ stream: {{ account: \"{PRODUCT_ACCOUNT}\", subject: \"{ro_events}\" }} }}"
    );
    let mut out = String::new();
    let _ = write!(
        out,
        "# Who may connect: the users below, with the passwords in {cred_dir}/secrets
# (generated on the stack's first start; 'stack rotate {name}' replaces them).
# There is no anonymous access and no no_auth_user.
{settings}
# Each user lives in an account of its own. A JetStream request's reply subject is the
# client's choice and the server answers there on the stream's or consumer's behalf: in one
# account, a read-only user could have events delivered into the work subjects. Across
# accounts the answer to an imported request goes back to the requester's own account,
# where no product subject or stream exists.
accounts {{
  {PRODUCT_ACCOUNT}: {{
    # The product's streams live in this account (store_dir/jetstream/{PRODUCT_ACCOUNT}/).
    jetstream: enabled
    users = [
      {{
        user: \"{NATS_APP_USER}\"
        password: \"{app_password}\"
        permissions: {{
          publish: {{ allow: {publish} }}
          subscribe: {{ allow: {subscribe} }}
        }}
      }}
    ]
    # What the analytics user and the event readers may read, each only by its own account.
    exports = [
{exports}    ]
  }}
  {ANALYTICS_ACCOUNT}: {{
    users = [
      {{
        user: \"{NATS_RO_USER}\"
        password: \"{ro_password}\"
        permissions: {{
          publish: {{ allow: {ro_publish} }}
          subscribe: {{ allow: {ro_subscribe} }}
        }}
      }}
    ]
    # The JetStream API calls under {api_prefix} (the client's API prefix).
    imports = [
{ro_import_entries}    ]
  }}
{readers}}}",
        cred_dir = c.cred_dir.display(),
        name = c.name,
        settings = settings_line(c.fingerprint, c.prefixes, c.analytics),
        app_password = c.credentials.nats_password,
        publish = quoted_list(&publish),
        subscribe = quoted_list(&subscribe),
        ro_password = c.credentials.analytics_password,
        ro_publish = quoted_list(&ro_publish),
        ro_subscribe = quoted_list(&ro_subscribe),
        api_prefix = crate::readers::EVENTS_API_PREFIX,
        readers = crate::readers::account_entries(c.readers, PRODUCT_ACCOUNT),
    );
    Ok(out)
}

/// The whole nats.conf of a single server.
pub fn render_conf(c: &ConfInput<'_>) -> Result<String> {
    render(c, None)
}

/// The config of node `cluster.node` of a cluster: a single server's, with the node's own
/// server name and a `cluster {}` block (`c` holds the node's own ports and files).
pub fn render_node_conf(c: &ConfInput<'_>, cluster: &ClusterNode) -> Result<String> {
    render(c, Some(cluster))
}

fn render(c: &ConfInput<'_>, cluster: Option<&ClusterNode>) -> Result<String> {
    let (header, server, store_note, block) = match cluster {
        None => (
            format!("the local Switchboard stack '{}'", c.name),
            format!("switchboard-{}", c.name),
            "nats/jetstream/".to_string(),
            String::new(),
        ),
        Some(node) => (
            format!(
                "node {} of {} of the local Switchboard stack '{}' (a JetStream cluster)",
                node.node,
                node.nodes(),
                c.name
            ),
            server_name(c.name, node.node),
            format!("{}/jetstream/", c.store_dir.display()),
            format!("\n{}", cluster_block(c.name, node)),
        ),
    };
    Ok(format!(
        "# NATS configuration for {header}.
# Generated by the stack tool (services/stack) on every start; edits are overwritten.
# It holds passwords: mode 0600.
server_name: \"{server}\"

# Loopback only.
listen: \"127.0.0.1:{port}\"
# HTTP monitoring (/healthz, /varz, /jsz).
http: \"127.0.0.1:{monitor}\"
pid_file: \"{pid_file}\"

# The default maximum message size (1 MB), stated so it is visible.
max_payload: 1MB

jetstream {{
  # nats-server appends \"jetstream/\" itself: streams end up in {store_note}.
  store_dir: \"{store_dir}\"

  # DURABILITY: sync_interval is left at its default, which fsyncs the stream
  # files only every 2 minutes; until then acknowledged messages may sit in the
  # OS page cache. Jepsen's NATS 2.12.1 analysis found acknowledged writes lost
  # after power failures / OS crashes with this default. Good enough for a
  # dev/test box. Production must use R3 (3-replica) streams and/or:
  # sync_interval: always
{sync}}}
{block}
{authorization}
",
        port = c.nats_port,
        monitor = c.monitor_port,
        pid_file = c.pid_file.display(),
        store_dir = c.store_dir.display(),
        sync = if c.sync_always {
            "  sync_interval: always\n"
        } else {
            ""
        },
        authorization = authorization(c)?,
    ))
}

#[cfg(test)]
#[path = "nats_tests.rs"]
mod tests;
