use super::*;

/// `toml` over the defaults, validated, as `Config::load` reads a file.
fn parse(toml: &str) -> Result<Config, ConfigError> {
    let c: Config = Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(toml))
        .extract()
        .map_err(|e| ConfigError::Load(Box::new(e)))?;
    c.validate()?;
    Ok(c)
}

#[test]
fn a_log_format_misspelt_is_refused_at_load_not_taken_for_text() {
    assert_eq!(
        parse("log_format = \"json\"").unwrap().log_format,
        LogFormat::Json
    );
    let err = format!("{:#}", parse("log_format = \"jsno\"").unwrap_err());
    assert!(err.contains("jsno") && err.contains("log_format"), "{err}");
}

#[test]
fn a_proof_sms_provider_misspelt_is_refused_at_load_naming_the_choices() {
    use super::identity::ProofSmsProvider;
    let provider = |toml: &str| parse(toml).map(|c| c.identity.proof.sms_provider);
    assert_eq!(provider("").unwrap(), ProofSmsProvider::Auto);
    assert_eq!(
        provider("[identity.proof]\nsms_provider = \"\"").unwrap(),
        ProofSmsProvider::Auto
    );
    assert_eq!(
        provider("[identity.proof]\nsms_provider = \"textmagic\"").unwrap(),
        ProofSmsProvider::TextMagic
    );
    let err = format!(
        "{:#}",
        provider("[identity.proof]\nsms_provider = \"twillio\"").unwrap_err()
    );
    assert!(
        err.contains("twillio") && err.contains("sms_provider") && err.contains("textmagic"),
        "{err}"
    );
}

#[test]
fn a_lookup_kind_misspelt_is_refused_at_load_not_silently_never_matched() {
    let lookup = |kind: &str| {
        format!("[[identity.lookups]]\nperson_type = \"staff\"\n{kind}sql = \"SELECT 1\"\n")
    };
    let c = parse(&lookup("")).unwrap();
    assert_eq!(
        c.identity.lookups[0].kind,
        ContactKind::Phone,
        "phones by default"
    );
    let c = parse(&lookup("kind = \"chat_user\"\n")).unwrap();
    assert_eq!(c.identity.lookups[0].kind, ContactKind::ChatUser);
    let err = format!("{:#}", parse(&lookup("kind = \"phnoe\"\n")).unwrap_err());
    assert!(err.contains("phnoe") && err.contains("chat_user"), "{err}");
}

#[test]
fn secrets_are_not_printed_by_debug() {
    let mut c = Config::default();
    c.twilio.auth_token = Secret::new("hunter2");
    assert!(!format!("{c:?}").contains("hunter2"));
}

#[test]
#[allow(clippy::result_large_err)] // figment's test jail API
fn environment_overrides_nested_keys() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "sb.toml",
            r#"
            nats_url = "nats://file:1"
            [twilio]
            api_base = "http://file"
            [[agents]]
            name = "reggie_oc"
            identity = "reggie"
            engine = "openclaw"
            runner_url = "http://runner"
            "#,
        )?;
        jail.set_env("SB_TWILIO__API_BASE", "http://env");
        jail.set_env("SB_NATS_URL", "nats://env:2");
        // Values that look like numbers, unquoted, into text fields; text into numbers.
        jail.set_env("SB_TWILIO__FROM_NUMBER", "+61400000000");
        jail.set_env("SB_TWILIO__ACCOUNT_SID", "12345");
        jail.set_env("SB_TEXTMAGIC__WEBHOOK_TOKEN", "00731");
        jail.set_env("SB_GATEWAY__MAX_TEXT_CHARS", "99");
        jail.set_env("SB_DEMO__ENABLED", "true");
        jail.set_env("SB_TEXTMAGIC__USERNAME", "\"quoted\"");
        let c = Config::load_from(Path::new("sb.toml")).expect("loads");
        assert_eq!(c.twilio.from_number, "+61400000000");
        assert_eq!(c.twilio.account_sid, "12345");
        assert_eq!(c.textmagic.webhook_token.expose(), "00731");
        assert_eq!(c.gateway.max_text_chars, 99);
        assert!(c.demo.enabled);
        assert_eq!(c.textmagic.username, "quoted");
        assert_eq!(c.twilio.api_base, "http://env");
        assert_eq!(c.nats_url, "nats://env:2");
        assert_eq!(c.agent("reggie_oc").unwrap().timeout_s, 120);
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment's test jail API
fn environment_sets_a_field_of_the_nth_agent() {
    // SB_AGENTS__0__TOKEN is how Compose and Kubernetes hand the runner token over: it used to
    // turn `agents` into a map and fail the whole load ("expected a sequence").
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "sb.toml",
            r#"
            [[agents]]
            name = "reggie_oc"
            identity = "reggie"
            engine = "openclaw"
            runner_url = "http://runner"
            [[agents]]
            name = "reggie_fd"
            identity = "reggie"
            engine = "droid"
            runner_url = "http://runner-2"
            "#,
        )?;
        jail.set_env("SB_AGENTS__0__TOKEN", "s3cret");
        jail.set_env("SB_AGENTS__1__RUNNER_URL", "http://elsewhere:8090");
        jail.set_env("SB_AGENTS__1__TIMEOUT_S", "30");
        let c = Config::load_from(Path::new("sb.toml")).expect("loads");
        let first = c.agent("reggie_oc").unwrap();
        assert_eq!(first.token.expose(), "s3cret");
        assert_eq!(first.runner_url, "http://runner");
        let second = c.agent("reggie_fd").unwrap();
        assert_eq!(second.runner_url, "http://elsewhere:8090");
        assert_eq!(second.timeout_s, 30);
        assert!(second.token.is_empty());
        Ok(())
    });
}

#[test]
fn an_indexed_key_names_the_array_the_index_and_the_rest() {
    assert_eq!(
        indexed("agents.0.token"),
        Some(("agents", 0, vec!["token"]))
    );
    assert_eq!(indexed("a.b.12.c.d"), Some(("a.b", 12, vec!["c", "d"])));
    assert_eq!(indexed("agents.3"), Some(("agents", 3, vec![])));
    assert_eq!(indexed("twilio.api_base"), None);
    assert_eq!(indexed("0.x"), None);
}

/// A channel adapter's own settings, as it would declare them.
#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
struct PigeonSettings {
    loft: String,
    birds: u32,
    api_key: String,
}

#[test]
#[allow(clippy::result_large_err)] // figment's test jail API
fn a_providers_section_is_read_by_its_adapter_from_the_file_and_the_environment() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "sb.toml",
            r#"
            [providers.pigeon]
            loft = "roof"
            api_key = "coo-secret"
            "#,
        )?;
        jail.set_env("SB_PROVIDERS__PIGEON__BIRDS", "12");
        let c = Config::load_from(Path::new("sb.toml")).expect("loads");
        let s: PigeonSettings = c.provider_settings("pigeon").expect("readable");
        assert_eq!((s.loft.as_str(), s.birds), ("roof", 12));
        assert!(
            !format!("{c:?}").contains("coo-secret"),
            "an adapter's settings may hold secrets: Debug names the section only"
        );
        let none: PigeonSettings = c.provider_settings("owl").expect("an absent section");
        assert_eq!(none, PigeonSettings::default());
        Ok(())
    });
    let mut c = Config::default();
    c.set_provider_settings(
        "pigeon",
        &serde_json::json!({"loft": "barn", "birds": "many"}),
    )
    .unwrap();
    let err = c.provider_settings::<PigeonSettings>("pigeon").unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { key, .. } if key == "providers.pigeon"),
        "{err}"
    );
    assert!(
        c.set_provider_settings("pigeon", &7).is_err(),
        "not a table"
    );
}

/// A shipped configuration file: every key in it is one the product reads (a typo there
/// would be ignored silently), and it loads over the defaults.
fn load_known_keys_only(relative: &str) -> Config {
    use figment::value::{Dict, Value};
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let file: Dict = Figment::from(Toml::file(&example))
        .extract()
        .expect("example parses");
    let known: Dict = Figment::from(Serialized::defaults(Config::default()))
        .extract()
        .expect("defaults serialise");
    fn check(path: &str, file: &Dict, known: &Dict) {
        for (key, value) in file {
            let here = format!("{path}{key}");
            // Maps and lists of the operator's own entries: any names allowed. (`providers`:
            // each adapter's section is checked by the adapter's own tests, which know its
            // keys.)
            if matches!(
                key.as_str(),
                "channels"
                    | "agents"
                    | "lookups"
                    | "stages"
                    | "authority"
                    | "schedules"
                    | "providers"
            ) {
                continue;
            }
            // Webhook sources: any names, but each entry's keys are checked.
            if key == "webhooks" {
                let source: Dict =
                    Figment::from(Serialized::defaults(WebhookSourceConfig::default()))
                        .extract()
                        .expect("defaults serialise");
                let Value::Dict(_, sources) = value else {
                    panic!("switchboard.toml: webhooks must be a table");
                };
                for (name, entry) in sources {
                    let Value::Dict(_, entry) = entry else {
                        panic!("switchboard.toml: webhooks.{name} must be a table");
                    };
                    check(&format!("{here}.{name}."), entry, &source);
                }
                continue;
            }
            let Some(k) = known.get(key) else {
                panic!("unknown key {here}");
            };
            if let (Value::Dict(_, f), Value::Dict(_, k)) = (value, k) {
                check(&format!("{here}."), f, k);
            }
        }
    }
    check("", &file, &known);
    Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::file(&example))
        .extract()
        .expect("example loads")
}

#[test]
fn the_production_example_runs_no_demo_and_holds_no_secret() {
    let c = load_known_keys_only("../../deploy/switchboard.production.toml");
    assert!(!c.demo.enabled);
    assert!(c.twilio.auth_token.is_empty() && c.textmagic.api_key.is_empty());
    assert!(c.textmagic.webhook_token.is_empty() && c.chat.jwt_secret.is_empty());
    assert!(c.agents.iter().all(|a| a.token.is_empty()));
    assert!(c.nats_url.is_empty() && c.database_url.is_empty());
    assert!(c.api.wait_max_ms < c.gateway.request_timeout_ms);
}

#[test]
fn the_deploy_configurations_name_only_known_keys_keep_secrets_out_and_run_streams_at_r3() {
    for path in [
        "../../deploy/kubernetes/switchboard.toml",
        "../../deploy/compose/switchboard.toml",
    ] {
        let c = load_known_keys_only(path);
        c.validate().unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(c.runtime.stream_replicas, 3, "{path}");
        assert!(c.agents.iter().all(|a| a.token.is_empty()), "{path}");
        assert!(c.nats_url.is_empty() && c.database_url.is_empty(), "{path}");
        // Probes and Prometheus reach the admin port from outside the pod or container.
        assert_eq!(c.admin.http_addr, "0.0.0.0:8081", "{path}");
        // The demo routes answer anyone who reaches the port: never on outside `make run`.
        assert!(!c.demo.enabled, "{path}: demo routes on");
    }
}

#[test]
fn stream_replicas_are_those_jetstream_keeps() {
    assert_eq!(parse("").unwrap().runtime.stream_replicas, 1);
    assert!(parse("[runtime]\nstream_replicas = 3").is_ok());
    for bad in [0, 6] {
        let err = parse(&format!("[runtime]\nstream_replicas = {bad}")).unwrap_err();
        assert!(err.to_string().contains("runtime.stream_replicas"), "{err}");
    }
}

#[test]
fn the_example_configuration_names_only_known_keys() {
    let c = load_known_keys_only("../../switchboard.toml");
    assert_eq!(c.session.arrival_gap_timeout_ms, 120_000);
    assert_eq!(c.dispatch.liveness_ms, 6_000);
    assert!(c.demo.enabled);
    let demo = &c.webhooks["demo"];
    assert!(!demo.secret.is_empty() && !demo.sender_field.is_empty());
}

#[test]
fn a_number_may_be_given_its_own_agent_and_only_a_configured_one() {
    let agent = |name: &str| {
        format!(
            "[[agents]]\nname = \"{name}\"\nidentity = \"reggie\"\nengine = \"openclaw\"\n\
             runner_url = \"http://r\"\n"
        )
    };
    let agents = agent("reggie_oc") + &agent("reggie_fd");
    let c = parse(&format!(
        "{agents}[channels.sms]\ndefault_agent = \"reggie_oc\"\n\
         [channels.sms.recipients]\n\"+15555550198\" = \"reggie_fd\"\n"
    ))
    .unwrap();
    let sms = &c.channels["sms"];
    assert_eq!(sms.agent_for("15555550198"), "reggie_fd");
    assert_eq!(sms.agent_for("+15555550199"), "reggie_oc");
    assert_eq!(sms.agent_for(""), "reggie_oc");
    assert!(
        parse(&format!(
            "{agents}[channels.sms.recipients]\n\"+15555550198\" = \"nobody\"\n"
        ))
        .is_err(),
        "a number given to an agent that is not configured"
    );
}

#[test]
fn a_webhook_source_needs_a_sender_field_and_gets_the_documented_defaults() {
    let c = parse("[webhooks.shop]\nsecret = \"k\"\nsender_field = \"user.id\"\n").unwrap();
    let shop = &c.webhooks["shop"];
    assert_eq!(
        (shop.text_field.as_str(), shop.id_field.as_str()),
        ("text", "id")
    );
    assert_eq!(shop.timestamp_window_s, 300);
    assert!(shop.agent.is_empty() && shop.callback_url.is_empty());
    assert_eq!(c.channels["webhook"].default_agent, "reggie_oc");
    assert!(
        parse("[webhooks.shop]\nsecret = \"k\"\n").is_err(),
        "sender_field is required"
    );
    for bad in [
        "[webhooks.\"a.b\"]\nsecret = \"k\"\nsender_field = \"u\"\n",
        "[webhooks.shop]\nsecret = \"k\"\nsender_field = \"user.\"\n",
        "[webhooks.shop]\nsecret = \"k\"\nsender_field = \"u\"\nagent = \"nobody\"\n",
        "[webhooks.shop]\nsecret = \"k\"\nsender_field = \"u\"\ntimestamp_window_s = 0\n",
        // Without a secret nothing could be verified or signed.
        "[webhooks.shop]\nsender_field = \"u\"\n",
        // pgvector refuses it at every search.
        "[embedding]\nivfflat_probes = 32769\n",
        "[embedding]\nivfflat_probes = 0\n",
    ] {
        assert!(
            matches!(parse(bad), Err(ConfigError::Invalid { .. })),
            "{bad}"
        );
    }
}

#[test]
fn console_jwts_are_off_by_default_and_need_an_audience_of_their_own() {
    let c = parse("").unwrap();
    assert!(
        c.console.jwt_roles.is_empty(),
        "API keys only unless roles are set"
    );
    let err = parse("[console]\njwt_roles = [\"admin\"]").unwrap_err();
    assert!(err.to_string().contains("console.jwt_audience"), "{err}");
    let same = parse(
        "[chat]\njwt_audience = \"app\"\n[console]\njwt_roles = [\"admin\"]\njwt_audience = \"app\"",
    )
    .unwrap_err();
    assert!(same.to_string().contains("chat.jwt_audience"), "{same}");
    let ok = parse("[console]\njwt_roles = [\"admin\"]\njwt_audience = \"switchboard-console\"")
        .unwrap();
    assert_eq!(ok.console.jwt_audience, "switchboard-console");
}

#[test]
fn an_agent_may_have_a_scope_of_its_own_but_an_identitys_variants_share_one() {
    let agents = |oc: &str, fd: &str| {
        format!(
            "[[agents]]\nname = \"reggie_oc\"\nidentity = \"reggie\"\nengine = \"openclaw\"\n\
             runner_url = \"http://127.0.0.1:1\"\n{oc}\n\
             [[agents]]\nname = \"reggie_fd\"\nidentity = \"reggie\"\nengine = \"droid\"\n\
             runner_url = \"http://127.0.0.1:1\"\n{fd}\n\
             [[agents]]\nname = \"desk\"\nidentity = \"desk\"\nengine = \"openclaw\"\n\
             runner_url = \"http://127.0.0.1:1\"\nscope = \"main\"\n"
        )
    };
    let c = parse(&agents("", "")).unwrap();
    let scope = |name: &str| c.agent(name).unwrap().scope_or(c.session.scope);
    assert_eq!(scope("reggie_oc"), SessionScope::Person, "the default");
    assert_eq!(scope("desk"), SessionScope::Main, "its own");
    parse(&agents("scope = \"channel\"", "scope = \"channel\"")).unwrap();
    let err = format!("{:#}", parse(&agents("scope = \"main\"", "")).unwrap_err());
    assert!(
        err.contains("reggie_oc") && err.contains("\"main\"") && err.contains("\"person\""),
        "{err}"
    );
    let err = format!("{:#}", parse(&agents("scope = \"mian\"", "")).unwrap_err());
    assert!(err.contains("mian"), "{err}");
}

#[test]
fn an_escalation_label_no_exchange_can_get_is_refused_at_load() {
    assert_eq!(
        parse("").unwrap().escalation.labels,
        ["escalation", "incident_report"]
    );
    assert!(parse("[escalation]\nlabels = []").is_ok());
    let err = format!(
        "{:#}",
        parse("[escalation]\nlabels = [\"incident\"]").unwrap_err()
    );
    assert!(
        err.contains("escalation.labels") && err.contains("\"incident\""),
        "{err}"
    );
}
