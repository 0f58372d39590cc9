//! Sessions: one per person + agent. The session stage finds or creates the session and gives
//! the message its place in the session (a contiguous `seq`), then emits the turn.
//!
//! Provider retries of the same message (same channel + provider message id) map to the same
//! turn, however late they come, so they never run twice.
use std::collections::BTreeMap;

use sqlx::{PgPool, Row};
use switchboard_kit::config::{AgentConfig, ChannelConfig};
use switchboard_kit::proto::{IdentifiedMessage, SessionCreated, Turn};
use switchboard_kit::{Delivery, Output, Stage, StageError, StageName, Topology};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("message has no {0}")]
    Incomplete(&'static str),
    #[error("no agent named {0:?} is configured")]
    UnknownAgent(String),
    #[error("channel {0:?} has no default agent and the message names none")]
    NoAgent(String),
    #[error("session store: {0}")]
    Database(#[from] sqlx::Error),
}

impl SessionError {
    fn into_stage(self) -> StageError {
        match self {
            SessionError::Database(_) => StageError::transient(self),
            _ => StageError::permanent(self),
        }
    }
}

/// The session a turn belongs to.
#[derive(Debug, Clone)]
pub struct OpenedTurn {
    pub session_id: Uuid,
    pub seq: i64,
    pub inbound_id: Uuid,
    pub scope_key: String,
}

pub struct SessionStore {
    db: PgPool,
}

impl SessionStore {
    pub fn new(db: PgPool) -> Self {
        Self { db }
    }

    /// Find or create the session of (scope, agent) and give this message its turn. Race-free
    /// across replicas: the session row is locked while its next `seq` is taken.
    pub async fn open_turn(
        &self,
        msg: &IdentifiedMessage,
        agent: &AgentConfig,
    ) -> Result<OpenedTurn, SessionError> {
        let inbound = msg
            .inbound
            .as_ref()
            .ok_or(SessionError::Incomplete("inbound"))?;
        let person = msg
            .person
            .as_ref()
            .ok_or(SessionError::Incomplete("person"))?;
        let inbound_id: Uuid = inbound
            .id
            .parse()
            .map_err(|_| SessionError::Incomplete("valid message id"))?;
        let scope_key = format!("{}:{}", person.person_type, person.person_id);
        // Without a provider id, the message id is the dedupe key.
        let provider_id = if inbound.provider_message_id.is_empty() {
            inbound.id.clone()
        } else {
            inbound.provider_message_id.clone()
        };

        let mut tx = self.db.begin().await?;
        sqlx::query(
            "INSERT INTO switchboard.sessions
                (id, person_type, person_id, agent_identity, agent_name, engine_type, channel, scope_key)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (scope_key, agent_name) DO NOTHING",
        )
        .bind(Uuid::now_v7())
        .bind(&person.person_type)
        .bind(&person.person_id)
        .bind(&agent.identity)
        .bind(&agent.name)
        .bind(&agent.engine)
        .bind(&inbound.channel)
        .bind(&scope_key)
        .execute(&mut *tx)
        .await?;
        let session_id: Uuid = sqlx::query_scalar(
            "SELECT id FROM switchboard.sessions WHERE scope_key = $1 AND agent_name = $2 FOR UPDATE",
        )
        .bind(&scope_key)
        .bind(&agent.name)
        .fetch_one(&mut *tx)
        .await?;

        // A retry of a message we already placed keeps its original turn.
        if let Some(r) = sqlx::query(
            "SELECT session_id, seq, inbound_id FROM switchboard.turns
              WHERE channel = $1 AND provider_message_id = $2",
        )
        .bind(&inbound.channel)
        .bind(&provider_id)
        .fetch_optional(&mut *tx)
        .await?
        {
            tx.commit().await?;
            return Ok(OpenedTurn {
                session_id: r.get(0),
                seq: r.get(1),
                inbound_id: r.get(2),
                scope_key,
            });
        }

        let seq: i64 = sqlx::query_scalar(
            "UPDATE switchboard.sessions SET next_seq = next_seq + 1, updated_at = now()
              WHERE id = $1 RETURNING next_seq - 1",
        )
        .bind(session_id)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO switchboard.turns (session_id, seq, inbound_id, channel, provider_message_id)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(session_id)
        .bind(seq)
        .bind(inbound_id)
        .bind(&inbound.channel)
        .bind(&provider_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(OpenedTurn {
            session_id,
            seq,
            inbound_id,
            scope_key,
        })
    }
}

/// Which agent a message goes to: the one it names, else its channel's default.
pub fn route_agent<'a>(
    agents: &'a [AgentConfig],
    channels: &BTreeMap<String, ChannelConfig>,
    channel: &str,
    requested: &str,
) -> Result<&'a AgentConfig, SessionError> {
    let name = if requested.is_empty() {
        channels
            .get(channel)
            .map(|c| c.default_agent.as_str())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| SessionError::NoAgent(channel.to_string()))?
    } else {
        requested
    };
    agents
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| SessionError::UnknownAgent(name.to_string()))
}

/// The session stage: `sb.identified` → `sb.turn.<partition>` (+ `session.created`).
pub struct SessionStage {
    store: SessionStore,
    agents: Vec<AgentConfig>,
    channels: BTreeMap<String, ChannelConfig>,
    topology: Topology,
}

impl SessionStage {
    pub fn new(
        store: SessionStore,
        agents: Vec<AgentConfig>,
        channels: BTreeMap<String, ChannelConfig>,
        topology: Topology,
    ) -> Self {
        Self {
            store,
            agents,
            channels,
            topology,
        }
    }
}

impl Stage for SessionStage {
    type Input = IdentifiedMessage;
    const NAME: StageName = StageName::Session;

    async fn handle(
        &self,
        mut msg: IdentifiedMessage,
        _delivery: &Delivery,
    ) -> Result<Vec<Output>, StageError> {
        let inbound = msg
            .inbound
            .as_ref()
            .ok_or_else(|| SessionError::Incomplete("inbound").into_stage())?;
        let agent = route_agent(
            &self.agents,
            &self.channels,
            &inbound.channel,
            &inbound.agent,
        )
        .map_err(SessionError::into_stage)?;
        let opened = self
            .store
            .open_turn(&msg, agent)
            .await
            .map_err(SessionError::into_stage)?;
        let correlation = inbound.correlation_id.clone();
        let channel = inbound.channel.clone();
        // A late provider retry carries a new message id; the turn keeps the first one.
        if let Some(i) = msg.inbound.as_mut() {
            i.id = opened.inbound_id.to_string();
        }
        let person = msg.person.clone().unwrap_or_default();
        let turn = Turn {
            session_id: opened.session_id.to_string(),
            seq: opened.seq,
            agent_name: agent.name.clone(),
            agent_identity: agent.identity.clone(),
            scope_key: opened.scope_key.clone(),
            message: Some(msg),
        };
        let key = format!("{}:{}", opened.session_id, opened.seq);
        let mut out = vec![
            Output::new(self.topology.turn(&opened.session_id), key, &turn)
                .correlated(correlation.clone()),
        ];
        if opened.seq == 1 {
            let created = SessionCreated {
                session_id: opened.session_id.to_string(),
                person_id: person.person_id,
                person_type: person.person_type,
                agent_name: agent.name.clone(),
                agent_identity: agent.identity.clone(),
                channel,
                created_at_ms: switchboard_kit::now_ms(),
            };
            out.push(
                Output::new(
                    self.topology.event("session.created"),
                    opened.session_id.to_string(),
                    &created,
                )
                .correlated(correlation),
            );
        }
        Ok(out)
    }
}

/// The session stage as a task of `app`.
pub fn task(app: &switchboard_kit::startup::App) -> switchboard_kit::startup::Task {
    let c = &app.config;
    let stage = SessionStage::new(
        SessionStore::new(app.db.clone()),
        c.agents.clone(),
        c.channels.clone(),
        app.topology.clone(),
    );
    app.stage_task(stage, app.stage_options())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str) -> AgentConfig {
        AgentConfig {
            name: name.into(),
            identity: "reggie".into(),
            engine: "openclaw".into(),
            runner_url: "http://runner".into(),
            token: Default::default(),
            timeout_s: 10,
            concurrency: 1,
        }
    }

    #[test]
    fn a_message_goes_to_the_agent_it_names_else_the_channel_default() {
        let agents = vec![agent("reggie_oc"), agent("reggie_fd")];
        let channels = BTreeMap::from([(
            "sms".to_string(),
            ChannelConfig {
                default_agent: "reggie_oc".into(),
            },
        )]);
        assert_eq!(
            route_agent(&agents, &channels, "sms", "").unwrap().name,
            "reggie_oc"
        );
        assert_eq!(
            route_agent(&agents, &channels, "sms", "reggie_fd")
                .unwrap()
                .name,
            "reggie_fd"
        );
        assert!(matches!(
            route_agent(&agents, &channels, "sms", "nobody"),
            Err(SessionError::UnknownAgent(_))
        ));
        assert!(matches!(
            route_agent(&agents, &channels, "api", ""),
            Err(SessionError::NoAgent(_))
        ));
    }
}
