//! Identity resolution: (channel, address) → one canonical person.
//!
//! Order: the directory (`contact_points` → `people`), then, for channels that authenticate
//! the person themselves (chat: the JWT's `sub` and claims → `user:<sub>`; API: the key's owner
//! → `api:<owner>`), who the channel says; else the operator's configured lookups (one SQL query
//! per person type against their own tables), else an external person whose id is the address
//! itself (`phone:+15551234567`, `webhook:<source>:<sender>`).
//!
//! Then the identity links an operator made ([`links`]) are followed to the canonical person.
//! The message becomes that person's: the directory's type, name and role for them; for a
//! canonical id the directory does not know (`user:ana`, whom only her chat token names), the
//! type its id's shape says (as identify would give it: `user:` and `api:` are users, an
//! address is external, `<lookup type>:` is that type) with the sender's own name and role.
//! The type matters: it is part of the session key, so a linked phone shares the session of
//! `user:ana`'s own chat messages only if both say `user`.
mod directory;
pub mod links;
pub mod proof;

use sqlx::{PgPool, Row};
use switchboard_kit::config::{ContactKind, IdentityConfig, IdentityLookup};
use switchboard_kit::proto::{IdentifiedMessage, InboundMessage, MessageReceived, Person};
use switchboard_kit::startup::{App, Task};
use switchboard_kit::{Attempt, Output, Stage, StageError, Topology};
use switchboard_kit::{Registration, Source, StageSpec};

pub use switchboard_kit::address::normalize_phone;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    InvalidPhone(#[from] switchboard_kit::address::InvalidPhone),
    #[error("empty sender address")]
    EmptyAddress,
    #[error("a heartbeat's input names no person of its own (asserted)")]
    HeartbeatWithoutPerson,
    #[error("directory lookup failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error("configured lookup for {person_type} failed: {source}")]
    Lookup {
        person_type: String,
        source: sqlx::Error,
    },
}

/// The id prefix of an external person (one nothing but the address identifies) of `kind`.
fn external_prefix(kind: ContactKind) -> &'static str {
    match kind {
        ContactKind::WebhookSender => "webhook",
        other => other.as_str(),
    }
}

/// The person type an id's shape says, for ids identify makes itself or a configured lookup
/// gives; `None` for any other id (only the directory knows those).
pub fn id_type<'a>(person_id: &str, config: &'a IdentityConfig) -> Option<&'a str> {
    let (prefix, rest) = person_id.split_once(':')?;
    if rest.is_empty() {
        return None;
    }
    match prefix {
        "user" => Some("user"),
        // An integration calling with an API key, not a person (seed 000 §3.1).
        "api" => Some("system"),
        "phone" | "chat_user" | "api_key_owner" | "address" | "webhook" | "telegram" | "slack"
        | "whatsapp" => Some("external"),
        _ => config
            .lookups
            .iter()
            .find(|l| l.person_type == prefix)
            .map(|l| l.person_type.as_str()),
    }
}

/// The contact point (kind, address) an id identify made from an address stands for.
pub fn contact_of(person_id: &str) -> Option<(ContactKind, String)> {
    let (prefix, rest) = person_id.split_once(':')?;
    let kind = match prefix {
        "phone" => ContactKind::Phone,
        "chat_user" | "user" => ContactKind::ChatUser,
        "api_key_owner" | "api" => ContactKind::ApiKeyOwner,
        "address" => ContactKind::Address,
        "webhook" => ContactKind::WebhookSender,
        "telegram" => ContactKind::Telegram,
        "slack" => ContactKind::Slack,
        "whatsapp" => ContactKind::WhatsApp,
        _ => return None,
    };
    (!rest.is_empty()).then(|| (kind, rest.to_string()))
}

pub struct IdentityResolver {
    db: PgPool,
    config: IdentityConfig,
    /// The contact point and link reads, many messages' at once.
    reads: directory::DirectoryReads,
}

impl IdentityResolver {
    pub fn new(db: PgPool, config: IdentityConfig) -> Self {
        let links = links::IdentityLinks::new(db.clone(), config.clone());
        let reads = directory::DirectoryReads::new(db.clone(), links);
        Self { db, config, reads }
    }

    /// The canonical person a message from `address` on `channel` belongs to.
    pub async fn resolve_identity(
        &self,
        channel: &str,
        address: &str,
        asserted: Option<&Person>,
    ) -> Result<Person, IdentityError> {
        let person = self.resolve_address(channel, address, asserted).await?;
        self.follow_links(person).await
    }

    async fn follow_links(&self, person: Person) -> Result<Person, IdentityError> {
        let canonical = self.reads.canonical(&person.person_id).await?;
        if canonical == person.person_id {
            return Ok(person);
        }
        let known = sqlx::query!(
            "SELECT person_type, name, role FROM switchboard.people WHERE person_id = $1",
            canonical,
        )
        .fetch_optional(&self.db)
        .await?;
        Ok(match known {
            Some(known) => Person {
                person_id: canonical,
                person_type: known.person_type,
                name: known.name,
                role: known.role,
                email: String::new(),
            },
            None => Person {
                person_type: id_type(&canonical, &self.config)
                    .unwrap_or(&person.person_type)
                    .to_string(),
                person_id: canonical,
                ..person
            },
        })
    }

    /// The person the directory, the channel or a lookup says `address` is (links not
    /// followed).
    pub async fn resolve_address(
        &self,
        channel: &str,
        address: &str,
        asserted: Option<&Person>,
    ) -> Result<Person, IdentityError> {
        let kind = ContactKind::of_channel(channel);
        let address = match kind {
            ContactKind::Phone | ContactKind::WhatsApp => {
                normalize_phone(address, &self.config.default_region)?
            }
            _ => address.trim().to_string(),
        };
        if address.is_empty() {
            return Err(IdentityError::EmptyAddress);
        }
        let row = self.reads.contact(kind.as_str(), &address).await?;
        if let Some(r) = row {
            return Ok(Person {
                person_id: r.person_id,
                person_type: r.person_type,
                name: r.name,
                role: r.role,
                email: String::new(),
            });
        }
        if let Some(person) = asserted.filter(|p| !p.person_id.is_empty()) {
            return Ok(person.clone());
        }
        for lookup in self.config.lookups.iter().filter(|l| l.kind == kind) {
            if let Some(p) = self.run_lookup(lookup, &address).await? {
                return Ok(p);
            }
        }
        Ok(Person {
            person_id: format!("{}:{address}", external_prefix(kind)),
            person_type: "external".into(),
            name: String::new(),
            role: String::new(),
            email: String::new(),
        })
    }

    async fn run_lookup(
        &self,
        lookup: &IdentityLookup,
        address: &str,
    ) -> Result<Option<Person>, IdentityError> {
        let err = |source| IdentityError::Lookup {
            person_type: lookup.person_type.clone(),
            source,
        };
        // The configured lookup's own SQL, known only at run time: checked when it runs.
        let row = sqlx::query(&lookup.sql)
            .bind(address)
            .fetch_optional(&self.db)
            .await
            .map_err(err)?;
        let Some(r) = row else { return Ok(None) };
        let person_id: String = r.try_get("person_id").map_err(err)?;
        let name: Option<String> = r.try_get("name").ok().flatten();
        let role: Option<String> = r.try_get("role").ok().flatten();
        Ok(Some(Person {
            person_id: format!("{}:{person_id}", lookup.person_type),
            person_type: lookup.person_type.clone(),
            name: name.unwrap_or_default(),
            role: role.unwrap_or_default(),
            email: String::new(),
        }))
    }
}

/// The identify stage: `sb.in.<channel>` → `sb.identified` (+ `message.received` event).
pub struct IdentifyStage {
    resolver: IdentityResolver,
    /// Links people prove by code ([`proof`]); none when switched off.
    proofs: Option<proof::LinkProofs>,
    topology: Topology,
}

impl IdentifyStage {
    pub fn new(
        resolver: IdentityResolver,
        proofs: Option<proof::LinkProofs>,
        topology: Topology,
    ) -> Self {
        Self {
            resolver,
            proofs,
            topology,
        }
    }

    async fn resolve(&self, inbound: &InboundMessage) -> Result<Person, StageError> {
        if inbound.heartbeat && !inbound.scheduled.is_empty() {
            // A heartbeat runs as its schedule (dispatch's scheduler set it), never as the
            // person its answer is addressed to: their address is only where it goes.
            return inbound
                .asserted
                .clone()
                .filter(|p| !p.person_id.is_empty())
                .ok_or_else(|| StageError::permanent(IdentityError::HeartbeatWithoutPerson));
        }
        match self
            .resolver
            .resolve_identity(&inbound.channel, &inbound.sender, inbound.asserted.as_ref())
            .await
        {
            Ok(p) => Ok(p),
            Err(e @ (IdentityError::InvalidPhone(_) | IdentityError::EmptyAddress)) => {
                Err(StageError::permanent(e))
            }
            Err(e) => Err(StageError::transient(e)),
        }
    }
}

/// The answer a `/reminders` message carries until dispatch, in its turn, writes the real one.
pub const REMINDERS_PENDING: &str = "(your reminders)";

/// The answer to `/remember <text>`.
pub fn remembered_answer(text: &str) -> String {
    let shown: String = text.chars().take(200).collect();
    let more = if text.chars().count() > 200 {
        "…"
    } else {
        ""
    };
    format!("Noted. I will remember: {shown}{more}")
}

impl Stage for IdentifyStage {
    type Input = InboundMessage;
    const SPEC: StageSpec = StageSpec::new("identify", Source::Work("in.>"));

    async fn handle(
        &self,
        mut inbound: InboundMessage,
        _attempt: &Attempt,
    ) -> Result<Vec<Output>, StageError> {
        let mut person = self.resolve(&inbound).await?;
        // A message the agent started was not received from anyone: no `message.received`,
        // and nothing in it to read as a request.
        let agent_started = inbound.is_agent_started();
        let mut code_message = None;
        if let Some(proofs) = self
            .proofs
            .as_ref()
            // Only the person's own words: never a schedule's text or an agent's wake-up note.
            .filter(|_| inbound.is_from_person())
            && let Some(ask) = proof::parse(&inbound.text)
            && let Some(answer) = proofs
                .answer(&self.resolver, &inbound, &person, ask)
                .await
                .map_err(StageError::transient)?
        {
            if answer.outcome == proof::ProofOutcome::Linked {
                // The message is the linked person's already.
                person = self.resolve(&inbound).await?;
            }
            if let Some(code) = &answer.code {
                let message = proofs.code_inbound(code, &inbound);
                code_message = Some(
                    Output::new(
                        self.topology.inbound(&message.channel),
                        format!("link-code:{}", code.id),
                        &message,
                    )
                    .correlated(message.correlation_id.clone()),
                );
            }
            // Switchboard answers it, in its turn, without the agent.
            inbound.outbound_text = answer.text;
        }
        // `/remember <text>`: Switchboard keeps it in the person's curated memory (dispatch
        // writes it, in the turn's place) and answers without the agent.
        if !agent_started
            && inbound.scheduled.is_empty()
            && inbound.outbound_text.is_empty()
            && let Some(text) = switchboard_kit::lifecycle::remember_command(&inbound.text)
        {
            inbound.outbound_text = remembered_answer(text);
        }
        // `/reminders`: Switchboard answers it without the agent; dispatch lists or cancels
        // the person's wake-ups in the turn's place and puts that answer here.
        if !agent_started
            && inbound.scheduled.is_empty()
            && inbound.outbound_text.is_empty()
            && switchboard_kit::wakeups::reminders_command(&inbound.text).is_some()
        {
            inbound.outbound_text = REMINDERS_PENDING.to_string();
        }
        tracing::debug!(person_id = %person.person_id, "identified");
        let received = MessageReceived {
            message_id: inbound.id.clone(),
            channel: inbound.channel.clone(),
            provider: inbound.provider.clone(),
            correlation_id: inbound.correlation_id.clone(),
            received_at_ms: inbound.received_at_ms,
        };
        let correlation = inbound.correlation_id.clone();
        let id = inbound.id.clone();
        let identified_on = self
            .topology
            .identified_from(&inbound.channel, &inbound.sender);
        let identified = IdentifiedMessage {
            inbound: Some(inbound),
            person: Some(person),
        };
        let mut out = vec![
            Output::new(identified_on, id.clone(), &identified).correlated(correlation.clone()),
        ];
        if !agent_started {
            out.push(
                Output::new(self.topology.event("message.received"), id, &received)
                    .correlated(correlation),
            );
        }
        out.extend(code_message);
        Ok(out)
    }
}

/// The identify stage, as the product lists it.
pub const STAGE: Registration = Registration {
    spec: IdentifyStage::SPEC,
    worker: "identify",
    start: task,
};

fn task(app: &App) -> Task {
    let identity = &app.config.identity;
    let resolver = IdentityResolver::new(app.db.clone(), identity.clone());
    let proofs = identity.proof.enabled.then(|| {
        proof::LinkProofs::new(
            app.db.clone(),
            links::IdentityLinks::new(app.db.clone(), identity.clone()),
            identity.proof.clone(),
            identity.default_region.clone(),
            app.config.proof_sms_sender(),
        )
    });
    let run = app.stage_task(IdentifyStage::new(resolver, proofs, app.topology.clone()));
    // Every message passes identify, so its workers always run: they keep the tables that
    // would otherwise grow for ever in check, beside the stage, until it has drained.
    let retention = switchboard_kit::retention::run(app.db.clone(), app.config.retention.clone());
    Box::pin(async move {
        tokio::select! {
            r = run => r,
            _ = retention => unreachable!("the retention sweep never returns"),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_kit::config::IdentityLookup;

    #[test]
    fn an_ids_shape_says_its_type_as_identify_would_give_it() {
        let config = IdentityConfig {
            lookups: vec![IdentityLookup {
                person_type: "staff".into(),
                kind: ContactKind::Phone,
                sql: String::new(),
            }],
            ..IdentityConfig::default()
        };
        assert_eq!(id_type("user:ana", &config), Some("user"));
        assert_eq!(id_type("api:crm", &config), Some("system"));
        assert_eq!(id_type("phone:+14155550100", &config), Some("external"));
        assert_eq!(id_type("staff:17", &config), Some("staff"));
        // Bare or unknown ids are the directory's to know.
        assert_eq!(id_type("staff-7", &config), None);
        assert_eq!(id_type("nurse:3", &config), None);
        assert_eq!(id_type("user:", &config), None);
    }

    #[test]
    fn an_id_made_from_an_address_names_its_contact_point() {
        assert_eq!(
            contact_of("phone:+14155550100"),
            Some((ContactKind::Phone, "+14155550100".into()))
        );
        assert_eq!(
            contact_of("user:ana"),
            Some((ContactKind::ChatUser, "ana".into()))
        );
        assert_eq!(
            contact_of("api:crm"),
            Some((ContactKind::ApiKeyOwner, "crm".into()))
        );
        assert_eq!(contact_of("staff-7"), None);
        assert_eq!(contact_of("staff:17"), None);
    }
}
