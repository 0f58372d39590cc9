//! Connection URLs carry credentials (`nats://user:password@host:port`,
//! `postgres://user:password@host:port/db`). Only their redacted form ([`redact_url`]) goes
//! into logs and errors, and NATS gets them as connect options ([`nats_connect`]): async-nats
//! ignores credentials written in the URL, and it would log the URL at debug level.
use async_nats::ConnectOptions;

/// `url` without its password: `nats://switchboard:***@127.0.0.1:14222`. A NATS list
/// (`nats://a:4222,nats://b:4222`) is redacted server by server. A query (libpq takes
/// `?password=`) is dropped for `?…`. A NATS token (`nats://TOKEN@host`, `tls://TOKEN@host`,
/// `ws[s]://…`) is the user-name part, so it goes too. A server without a scheme is read as
/// NATS reads it (`user:pass@host:4222` is `nats://user:pass@host:4222`). Text that is not a
/// URL is not shown at all.
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|one| redact_one(one.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The schemes of NATS servers (async-nats' `ServerAddr`): in these a user name without a
/// password is a token.
const NATS_SCHEMES: &[&str] = &["nats", "tls", "ws", "wss"];

fn redact_one(raw: &str) -> String {
    // Without `://`, `user:pass@host` would parse as the scheme `user` and a path holding the
    // password.
    let with_scheme = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("nats://{raw}")
    };
    let Ok(mut url) = url::Url::parse(&with_scheme) else {
        return "<not a URL>".into();
    };
    let had_query = url.query().is_some();
    url.set_query(None);
    url.set_fragment(None);
    if url.password().is_some() {
        // Cannot fail: the URL has a host (it has credentials).
        let _ = url.set_password(Some("***"));
    } else if !url.username().is_empty() && NATS_SCHEMES.contains(&url.scheme()) {
        // nats://<token>@host: the user name is the secret.
        let _ = url.set_username("***");
    }
    let mut out = url.to_string();
    if had_query {
        out.push_str("?…");
    }
    out
}

/// Where a NATS URL points, and the credentials written into it.
#[derive(PartialEq, Eq)]
pub struct NatsTarget {
    /// The servers, without credentials.
    pub servers: Vec<String>,
    pub auth: NatsAuth,
}

#[derive(PartialEq, Eq)]
pub enum NatsAuth {
    None,
    UserPassword { user: String, password: String },
    Token(String),
}

impl std::fmt::Debug for NatsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = match self.auth {
            NatsAuth::None => "none",
            NatsAuth::UserPassword { .. } => "user and password",
            NatsAuth::Token(_) => "token",
        };
        f.debug_struct("NatsTarget")
            .field("servers", &self.servers)
            .field("auth", &auth)
            .finish()
    }
}

/// What is wrong with a NATS URL, or connecting to it; every URL in here is redacted.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("nats_url is not set: set it in the configuration file or as SB_NATS_URL")]
    NoUrl,
    #[error("invalid NATS URL {url}: {reason}")]
    Invalid { url: String, reason: String },
    #[error("the servers of {url} name different credentials; use one user for all")]
    MixedCredentials { url: String },
    #[error("connecting to NATS at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
}

/// Split a NATS URL (or a comma-separated list of them) into servers and credentials
/// (percent-decoded). `nats://host` with no scheme is accepted as async-nats does.
pub fn nats_target(url: &str) -> Result<NatsTarget, EndpointError> {
    if url.trim().is_empty() {
        return Err(EndpointError::NoUrl);
    }
    let mut servers = Vec::new();
    let mut auth = NatsAuth::None;
    for raw in url.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let with_scheme = if raw.contains("://") {
            raw.to_string()
        } else {
            format!("nats://{raw}")
        };
        let invalid = |reason: String| EndpointError::Invalid {
            url: redact_url(url),
            reason,
        };
        let mut parsed = url::Url::parse(&with_scheme).map_err(|e| invalid(e.to_string()))?;
        let here = match (parsed.username(), parsed.password()) {
            ("", None) => NatsAuth::None,
            (user, Some(password)) => NatsAuth::UserPassword {
                user: decoded(user),
                password: decoded(password),
            },
            (token, None) => NatsAuth::Token(decoded(token)),
        };
        match (&auth, here) {
            (_, NatsAuth::None) => {}
            (NatsAuth::None, found) => auth = found,
            (same, found) if *same == found => {}
            _ => {
                return Err(EndpointError::MixedCredentials {
                    url: redact_url(url),
                });
            }
        }
        parsed
            .set_password(None)
            .and_then(|()| parsed.set_username(""))
            .map_err(|()| invalid("cannot remove the credentials".into()))?;
        servers.push(parsed.to_string().trim_end_matches('/').to_string());
    }
    if servers.is_empty() {
        return Err(EndpointError::Invalid {
            url: redact_url(url),
            reason: "no server".into(),
        });
    }
    Ok(NatsTarget { servers, auth })
}

/// `%40` back to `@` (the URL's user and password are percent-encoded; `+` stays `+`).
fn decoded(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Connect to NATS at `url` with `options`, the credentials in the URL included. Errors name
/// the URL redacted.
pub async fn nats_connect(
    url: &str,
    options: ConnectOptions,
) -> Result<async_nats::Client, EndpointError> {
    let target = nats_target(url)?;
    let options = match target.auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword { user, password } => options.user_and_password(user, password),
        NatsAuth::Token(token) => options.token(token),
    };
    let servers: Vec<async_nats::ServerAddr> = target
        .servers
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()
        .map_err(|e: std::io::Error| EndpointError::Invalid {
            url: redact_url(url),
            reason: e.to_string(),
        })?;
    // A server reloading its accounts (`switchboard readers add` does, on the running stack)
    // refuses a connection for a moment with an authorization error, correct credentials and
    // all: a few quick tries tell that from a wrong password (seen once in a full test run).
    let mut tries = 0;
    loop {
        tries += 1;
        match options.clone().connect(servers.clone()).await {
            Ok(client) => return Ok(client),
            Err(source)
                if tries < 5
                    && matches!(
                        source.kind(),
                        async_nats::ConnectErrorKind::AuthorizationViolation
                    ) =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(source) => {
                return Err(EndpointError::Connect {
                    url: redact_url(url),
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_keeps_where_and_who_but_not_the_password() {
        assert_eq!(
            redact_url("nats://switchboard:s3cr3tPa55@127.0.0.1:14222"),
            "nats://switchboard:***@127.0.0.1:14222"
        );
        assert_eq!(
            redact_url("postgres://switchboard:s3cr3tPa55@127.0.0.1:15432/switchboard"),
            "postgres://switchboard:***@127.0.0.1:15432/switchboard"
        );
        // libpq also takes the password as a parameter.
        let r = redact_url("postgres://u@db:5432/app?sslmode=require&password=s3cr3tPa55");
        assert_eq!(r, "postgres://u@db:5432/app?…");
        // A NATS token is the user-name part.
        assert_eq!(
            redact_url("nats://s3cr3tPa55@127.0.0.1:4222"),
            "nats://***@127.0.0.1:4222"
        );
        // A server list, each one.
        let r = redact_url("nats://a:s3cr3tPa55@h1:4222, nats://a:s3cr3tPa55@h2:4222");
        assert_eq!(r, "nats://a:***@h1:4222,nats://a:***@h2:4222");
        // Without credentials nothing changes; what does not parse is not shown.
        assert_eq!(
            redact_url("nats://127.0.0.1:14222"),
            "nats://127.0.0.1:14222"
        );
        assert_eq!(redact_url("s3cr3tPa55 @ nowhere"), "<not a URL>");
        for url in [
            "nats://switchboard:s3cr3tPa55@127.0.0.1:14222",
            "postgres://switchboard:s3cr3tPa55@127.0.0.1:15432/x?password=s3cr3tPa55",
            "nats://s3cr3tPa55@h:1",
            "://s3cr3tPa55@",
            "switchboard:s3cr3tPa55@127.0.0.1:4222",
            "s3cr3tPa55@127.0.0.1:4222",
        ] {
            assert!(!redact_url(url).contains("s3cr3tPa55"), "{url}");
        }
    }

    #[test]
    fn a_token_is_redacted_in_every_nats_scheme_and_without_one() {
        for scheme in ["nats", "tls", "ws", "wss"] {
            let shown = redact_url(&format!("{scheme}://s3cr3tT0ken@nats.example.com:4222"));
            // ws and wss are special schemes to the url crate: they gain a `/` path.
            assert_eq!(
                shown.trim_end_matches('/'),
                format!("{scheme}://***@nats.example.com:4222")
            );
        }
        // NATS reads a server without a scheme as nats://…; so does the redaction.
        assert_eq!(
            redact_url("s3cr3tT0ken@127.0.0.1:4222"),
            "nats://***@127.0.0.1:4222"
        );
        assert_eq!(
            redact_url("switchboard:s3cr3tPa55@127.0.0.1:4222"),
            "nats://switchboard:***@127.0.0.1:4222"
        );
        // A Postgres role is no secret: only its password is.
        assert_eq!(
            redact_url("postgres://switchboard@db:5432/switchboard"),
            "postgres://switchboard@db:5432/switchboard"
        );
        let t = nats_target("tls://s3cr3tT0ken@nats.example.com:4222").unwrap();
        assert!(t.auth == NatsAuth::Token("s3cr3tT0ken".into()));
        assert_eq!(t.servers, vec!["tls://nats.example.com:4222"]);
    }

    #[test]
    fn credentials_are_percent_decoded_and_only_there() {
        let t = nats_target("nats://sw%3Aitch:p%40ss%2Fw%25rd+x@h:1").unwrap();
        assert!(
            t.auth
                == NatsAuth::UserPassword {
                    user: "sw:itch".into(),
                    password: "p@ss/w%rd+x".into()
                }
        );
        // Not valid UTF-8 once decoded: replaced, not refused.
        let t = nats_target("nats://tok%FF@h:1").unwrap();
        assert!(t.auth == NatsAuth::Token("tok\u{fffd}".into()));
    }

    #[tokio::test]
    async fn connecting_names_the_setting_or_the_url_without_its_password() {
        for url in ["", " "] {
            let e = nats_connect(url, ConnectOptions::new()).await.unwrap_err();
            assert!(matches!(e, EndpointError::NoUrl), "{e:?}");
            let shown = e.to_string();
            assert!(
                shown.contains("nats_url") && shown.contains("SB_NATS_URL"),
                "{shown}"
            );
        }
        // Nothing listens on port 1: refused at once.
        let e = nats_connect(
            "nats://switchboard:s3cr3tPa55@127.0.0.1:1",
            ConnectOptions::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, EndpointError::Connect { .. }), "{e:?}");
        let debug = format!("{e:?}");
        let chain = format!("{:#} {debug}", anyhow::Error::from(e));
        assert!(
            chain.contains("nats://switchboard:***@127.0.0.1:1"),
            "{chain}"
        );
        assert!(!chain.contains("s3cr3tPa55"), "{chain}");
    }

    #[test]
    fn nats_credentials_come_out_of_the_url() {
        let t = nats_target("nats://switchboard:p%40ss@127.0.0.1:14222").unwrap();
        assert_eq!(t.servers, vec!["nats://127.0.0.1:14222"]);
        assert!(
            t.auth
                == NatsAuth::UserPassword {
                    user: "switchboard".into(),
                    password: "p@ss".into()
                }
        );
        assert!(!format!("{t:?}").contains("p@ss"));

        let t = nats_target("127.0.0.1:4222").unwrap();
        assert_eq!(t.servers, vec!["nats://127.0.0.1:4222"]);
        assert!(t.auth == NatsAuth::None);

        let t = nats_target("nats://tok@h1:1,nats://h2:2").unwrap();
        assert_eq!(t.servers, vec!["nats://h1:1", "nats://h2:2"]);
        assert!(t.auth == NatsAuth::Token("tok".into()));

        let err = nats_target("nats://a:s3cr3t@h1:1,nats://b:other@h2:2").unwrap_err();
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
        assert!(nats_target("").is_err());
    }

    #[test]
    fn the_configuration_debug_output_shows_no_connection_password() {
        let c = crate::Config {
            nats_url: "nats://switchboard:s3cr3tPa55@127.0.0.1:14222".into(),
            database_url: "postgres://switchboard:s3cr3tPa55@127.0.0.1:15432/switchboard".into(),
            ..Default::default()
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3tPa55"), "{shown}");
        assert!(shown.contains("nats://switchboard:***@127.0.0.1:14222"));
    }
}
