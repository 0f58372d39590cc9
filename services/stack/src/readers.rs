//! Event readers: NATS users that may only fetch from and acknowledge on one durable consumer
//! of an events stream (`switchboard readers add`). A reader keeps its position in the stream
//! across restarts without the right to create consumers, which the `analytics` user lacks on
//! purpose (nats-server issue 8274: a push consumer's deliver subject is not checked against its
//! creator's rights).
//!
//! Each reader lives in a NATS account of its own ([`Reader::account`]) that imports only its
//! consumer's API from the product's account. Permissions alone cannot confine a reader: the
//! reply subject of a pull request is the client's choice and the server delivers there on the
//! consumer's behalf, so a reader in the product's account could have its events delivered
//! into the work stream (`reply: sb.identified`). Across accounts, the reply of an imported
//! request is answered in the requester's own account, where no product stream lives.
//!
//! The list is `<stack>/nats/readers`, one reader a line (user, bcrypt hash of the password,
//! stream, consumer; tab-separated). Every nats.conf the stack writes lists them, and
//! [`crate::commands::update_readers`] rewrites the configs and reloads the running servers
//! (SIGHUP: the server's own config reload; clients stay connected).
use std::path::Path;

use crate::{Error, Result};

/// The subject prefix under which a reader (and the `analytics` user) finds the JetStream API
/// calls imported into its account: clients use it as their JetStream API prefix (nats-py
/// `nc.jetstream(prefix=...)`, async-nats `jetstream::with_prefix`). Not `$JS.API`: in an
/// account without JetStream the server itself answers `$JS.API.*` requests ("JetStream not
/// enabled for account") before the import does.
pub const EVENTS_API_PREFIX: &str = "JS.EVENTS.API";

/// A service one account imports from the product's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceImport {
    /// The subject in the product's account (what it exports).
    pub subject: String,
    /// The subject in the importing account, when not the same.
    pub local: Option<String>,
    /// The service answers with several messages (a pull request's deliveries).
    pub streamed: bool,
}

impl ServiceImport {
    /// `$JS.API.<api>` imported as `EVENTS_API_PREFIX.<api>`.
    pub fn api(api: &str, streamed: bool) -> ServiceImport {
        ServiceImport {
            subject: format!("$JS.API.{api}"),
            local: Some(format!("{EVENTS_API_PREFIX}.{api}")),
            streamed,
        }
    }

    /// Imported under its own name.
    pub fn same(subject: String, streamed: bool) -> ServiceImport {
        ServiceImport {
            subject,
            local: None,
            streamed,
        }
    }

    /// The subject the importing account's clients publish to.
    pub fn local_subject(&self) -> &str {
        self.local.as_deref().unwrap_or(&self.subject)
    }

    /// Its entry in an account's `imports`.
    pub fn import_entry(&self, from: &str) -> String {
        match &self.local {
            Some(to) => format!(
                "{{ service: {{ account: \"{from}\", subject: \"{}\" }}, to: \"{to}\" }}",
                self.subject
            ),
            None => format!(
                "{{ service: {{ account: \"{from}\", subject: \"{}\" }} }}",
                self.subject
            ),
        }
    }
}

/// One reader's NATS user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reader {
    pub user: String,
    /// The password as bcrypt (`$2a$…`, `$2b$…`): nats-server compares the hash itself, so the
    /// password is shown once by whoever made it and stored nowhere.
    pub password_hash: String,
    pub stream: String,
    pub consumer: String,
}

/// A name NATS takes as one subject token and a config string without quoting.
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Reader {
    /// The reader's own reply-subject prefix: clients connect with it (nats-py's
    /// `inbox_prefix`, async-nats' `custom_inbox_prefix`), so no reader receives another
    /// user's replies.
    pub fn inbox_prefix(&self) -> String {
        format!("_INBOX_{}", self.user)
    }

    /// The reader's own NATS account.
    pub fn account(&self) -> String {
        format!("READER_{}", self.user)
    }

    /// What its account imports from the product's: fetch (`CONSUMER.MSG.NEXT`, also under
    /// its own name so that clients without an API prefix fetch as before), acknowledge
    /// (`$JS.ACK`), and read its consumer's and stream's state; nothing that creates, changes
    /// or deletes.
    pub fn imports(&self) -> Vec<ServiceImport> {
        let (s, c) = (&self.stream, &self.consumer);
        vec![
            ServiceImport::api(&format!("STREAM.INFO.{s}"), false),
            ServiceImport::api(&format!("CONSUMER.INFO.{s}.{c}"), false),
            ServiceImport::api(&format!("CONSUMER.MSG.NEXT.{s}.{c}"), true),
            ServiceImport::same(format!("$JS.API.CONSUMER.MSG.NEXT.{s}.{c}"), true),
            ServiceImport::same(format!("$JS.ACK.{s}.{c}.>"), false),
        ]
    }

    /// Its imports and nothing else (in its own account, a defence in depth).
    pub fn publish_allowed(&self) -> Vec<String> {
        self.imports()
            .iter()
            .map(|i| i.local_subject().to_string())
            .collect()
    }

    pub fn subscribe_allowed(&self) -> Vec<String> {
        vec![format!("{}.>", self.inbox_prefix())]
    }

    fn check(&self) -> Result<()> {
        for (what, value) in [
            ("user", &self.user),
            ("stream", &self.stream),
            ("consumer", &self.consumer),
        ] {
            if !is_name(value) {
                return Err(Error::Invalid(format!(
                    "reader {what} '{value}': use letters, digits, '_' and '-' (at most 64)"
                )));
            }
        }
        let hash = &self.password_hash;
        let bcrypt = hash.len() == 60
            && ["$2a$", "$2b$", "$2y$"].iter().any(|p| hash.starts_with(p))
            && hash
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"$./".contains(&b));
        if !bcrypt {
            return Err(Error::Invalid(format!(
                "reader '{}': the password is not a bcrypt hash",
                self.user
            )));
        }
        Ok(())
    }
}

/// The readers in `path` (none when it does not exist).
pub fn load(path: &Path) -> Result<Vec<Reader>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("reading", path, e)),
    };
    let mut readers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let [user, hash, stream, consumer] = fields[..] else {
            return Err(Error::Invalid(format!(
                "{} line {}: expected user, hash, stream and consumer, tab-separated",
                path.display(),
                n + 1
            )));
        };
        let reader = Reader {
            user: user.into(),
            password_hash: hash.into(),
            stream: stream.into(),
            consumer: consumer.into(),
        };
        reader.check()?;
        readers.push(reader);
    }
    Ok(readers)
}

/// Write `readers` to `path` (0600), checked first.
pub fn save(path: &Path, readers: &[Reader]) -> Result<()> {
    let mut text = String::from(
        "# Event readers (switchboard readers add|remove): user, bcrypt hash, stream, consumer.\n",
    );
    for r in readers {
        r.check()?;
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            r.user, r.password_hash, r.stream, r.consumer
        ));
    }
    crate::sys::private_write(path, &text)
}

/// The accounts of `readers` (entries of `accounts { ... }`), importing from `product`, as
/// nats.conf text.
pub fn account_entries(readers: &[Reader], product: &str) -> String {
    let quoted = |items: Vec<String>| {
        let q: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
        format!("[{}]", q.join(", "))
    };
    let mut out = String::new();
    for r in readers {
        let imports: Vec<String> = r
            .imports()
            .iter()
            .map(|i| format!("      {}\n", i.import_entry(product)))
            .collect();
        out.push_str(&format!(
            "  # Event reader: fetch and ack on {stream} > {consumer} only.
  \"{account}\": {{
    users = [
      {{
        user: \"{user}\"
        password: \"{hash}\"
        permissions: {{
          publish: {{ allow: {publish} }}
          subscribe: {{ allow: {subscribe} }}
        }}
      }}
    ]
    imports = [
{imports}    ]
  }}
",
            stream = r.stream,
            consumer = r.consumer,
            account = r.account(),
            user = r.user,
            hash = r.password_hash,
            publish = quoted(r.publish_allowed()),
            subscribe = quoted(r.subscribe_allowed()),
            imports = imports.concat(),
        ));
    }
    out
}

/// What a reader made outside the embedded stack needs in your own nats.conf: its account, and
/// the exports of the product's account (`product`) that the account imports.
pub fn config_for_your_own(reader: &Reader, product: &str) -> String {
    let exports: Vec<String> = reader
        .imports()
        .iter()
        .map(|i| {
            format!(
                "      {{ service: \"{}\"{}, accounts: [\"{}\"] }}\n",
                i.subject,
                if i.streamed {
                    ", response_type: stream"
                } else {
                    ""
                },
                reader.account()
            )
        })
        .collect();
    format!(
        "# In accounts {{ {product}: {{ exports = [ ... ] }} }} (a subject already exported: add \
         the account to its accounts list):\n{}# In accounts {{ ... }}:\n{}",
        exports.concat(),
        account_entries(std::slice::from_ref(reader), product)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(user: &str) -> Reader {
        Reader {
            user: user.into(),
            password_hash: format!("$2b$10${}", "a".repeat(53)),
            stream: "SB_EVENTS".into(),
            consumer: format!("reader_{user}"),
        }
    }

    #[test]
    fn readers_survive_a_save_and_load_and_bad_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("sb-readers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("readers");
        assert_eq!(load(&path).unwrap(), vec![]);
        let list = vec![reader("bi"), reader("crm-export")];
        save(&path, &list).unwrap();
        assert_eq!(load(&path).unwrap(), list);

        let mut bad = reader("bi");
        bad.user = "bi\" }".into();
        assert!(save(&path, &[bad]).is_err());
        let mut plain = reader("bi");
        plain.password_hash = "hunter2".into();
        assert!(save(&path, &[plain]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_reader_may_fetch_and_ack_on_its_consumer_and_nothing_else() {
        let r = reader("bi");
        let publish = r.publish_allowed();
        assert!(publish.contains(&"$JS.API.CONSUMER.MSG.NEXT.SB_EVENTS.reader_bi".to_string()));
        assert!(
            publish.contains(&"JS.EVENTS.API.CONSUMER.MSG.NEXT.SB_EVENTS.reader_bi".to_string())
        );
        assert!(publish.contains(&"$JS.ACK.SB_EVENTS.reader_bi.>".to_string()));
        assert!(
            !publish
                .iter()
                .any(|p| p.contains("CREATE") || p.contains("DELETE"))
        );
        assert_eq!(r.subscribe_allowed(), vec!["_INBOX_bi.>".to_string()]);
        let conf = account_entries(std::slice::from_ref(&r), "SWITCHBOARD");
        assert!(conf.contains("\"READER_bi\": {"), "{conf}");
        assert!(conf.contains("user: \"bi\""), "{conf}");
        assert!(
            conf.contains(
                "{ service: { account: \"SWITCHBOARD\", subject: \"$JS.API.CONSUMER.INFO.SB_EVENTS.reader_bi\" }, to: \"JS.EVENTS.API.CONSUMER.INFO.SB_EVENTS.reader_bi\" }"
            ),
            "{conf}"
        );
        let own = config_for_your_own(&r, "SWITCHBOARD");
        assert!(
            own.contains(
                "{ service: \"$JS.API.CONSUMER.MSG.NEXT.SB_EVENTS.reader_bi\", response_type: stream, accounts: [\"READER_bi\"] }"
            ),
            "{own}"
        );
    }
}
