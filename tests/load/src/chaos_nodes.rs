//! NATS node kills in a cluster run (`make chaos CLUSTER=3`): at set times one node of the
//! JetStream cluster is SIGKILLed and started again on its data, chosen by role: the current
//! leader of the work stream (its replicas must elect another and the product must carry on
//! through the move), or a node that leads nothing of it (a follower catching up).
use std::time::Duration;

use async_nats::jetstream;

/// Which node a kill takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// The work stream's leader when the kill is due.
    Leader,
    /// A node that is not the work stream's leader.
    Follower,
}

/// One planned node kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeKill {
    pub at: Duration,
    pub role: NodeRole,
}

/// The node kills of a run on a cluster of `nodes` whose load lasts `window`: the work
/// stream's leader at a fifth and at half of it, a follower at four fifths. None for a single
/// server (its crash is `crash_nats_at`).
pub fn plan(nodes: usize, window: Duration) -> Vec<NodeKill> {
    if nodes < 3 {
        return Vec::new();
    }
    [
        (0.2, NodeRole::Leader),
        (0.5, NodeRole::Leader),
        (0.8, NodeRole::Follower),
    ]
    .into_iter()
    .map(|(share, role)| NodeKill {
        at: window.mul_f64(share),
        role,
    })
    .collect()
}

/// The node (1-based, as `stack crash <name> nats-<i>` counts them) serving as `stream`'s
/// leader, from the server name the stack gives node i: `switchboard-<stack>-<i>`. `None` while
/// the stream has no leader (an election under way) or the cluster cannot be asked.
pub async fn leader_of(js: &jetstream::Context, stream: &str) -> Option<usize> {
    let ask = async {
        let mut s = js.get_stream(stream).await.ok()?;
        let info = s.info().await.ok()?;
        let leader = info.cluster.as_ref()?.leader.clone()?;
        node_of(&leader)
    };
    tokio::time::timeout(Duration::from_secs(5), ask)
        .await
        .ok()
        .flatten()
}

/// Node i of the server name `switchboard-<stack>-<i>`.
pub fn node_of(server_name: &str) -> Option<usize> {
    server_name.rsplit_once('-')?.1.parse().ok()
}

/// The node a kill of `role` takes on a cluster of `nodes`, given the current `leader` (when
/// known) and a random number `pick`. A leader kill with the leader unknown takes node `pick`.
pub fn target(role: NodeRole, nodes: usize, leader: Option<usize>, pick: usize) -> usize {
    match (role, leader) {
        (NodeRole::Leader, Some(l)) => l,
        (NodeRole::Follower, Some(l)) => {
            let others: Vec<usize> = (1..=nodes).filter(|n| *n != l).collect();
            others[pick % others.len()]
        }
        (_, None) => 1 + pick % nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_run_kills_the_work_streams_leader_twice_and_a_follower_once() {
        let p = plan(3, Duration::from_secs(50));
        let leaders = p.iter().filter(|k| k.role == NodeRole::Leader).count();
        assert_eq!(leaders, 2);
        assert_eq!(p.len(), 3);
        assert!(p.windows(2).all(|w| w[0].at < w[1].at));
        assert!(p.iter().all(|k| k.at < Duration::from_secs(50)));
        assert!(plan(1, Duration::from_secs(50)).is_empty());
    }

    #[test]
    fn the_target_is_the_leader_or_another_node() {
        assert_eq!(node_of("switchboard-chaos-2"), Some(2));
        assert_eq!(node_of("switchboard-chaos-small-3"), Some(3));
        assert_eq!(target(NodeRole::Leader, 3, Some(2), 7), 2);
        for pick in 0..6 {
            let t = target(NodeRole::Follower, 3, Some(2), pick);
            assert!(t == 1 || t == 3, "{t}");
            assert!((1..=3).contains(&target(NodeRole::Leader, 3, None, pick)));
        }
    }
}
