//! NATS as a JetStream cluster on loopback (`SB_STACK_NATS_CLUSTER=3|5`): the cluster's size,
//! each node's ports, and the `cluster {}` block of a node's config. Node i (1-based) listens
//! for clients on `nats_port + i - 1`, for monitoring on `monitor_port + i - 1` and for routes
//! on `nats_port + 10 + i - 1`. Unset or 1: the single server the stack always ran, unchanged.
use std::fmt::Write as _;

use crate::{Error, Result};

/// The variable `up` reads the cluster size from.
pub const CLUSTER_VAR: &str = "SB_STACK_NATS_CLUSTER";

/// The route (cluster) port of node i is its client port + this: with at most 5 nodes the
/// client and route ranges never meet.
pub const ROUTE_OFFSET: u16 = 10;

/// `SB_STACK_NATS_CLUSTER` as `up` takes it: unset or `1` a single server, `3` or `5` a cluster
/// of that many nodes. Other sizes are refused: JetStream's Raft groups need an odd number of
/// peers to keep a quorum when one fails, and more than 5 on one machine tests nothing more.
pub fn cluster_size(raw: Option<&str>) -> Result<u16> {
    match raw {
        None | Some("1") => Ok(1),
        Some("3") => Ok(3),
        Some("5") => Ok(5),
        Some(other) => Err(Error::Usage(format!(
            "{CLUSTER_VAR} must be 1 (one NATS server, the default), 3 or 5 (a JetStream cluster of that many nodes), got '{other}'"
        ))),
    }
}

/// The ports of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePorts {
    pub client: u16,
    pub monitor: u16,
    /// Cluster routes; only a cluster node listens on it.
    pub route: u16,
}

/// Node `node`'s (1-based) ports, from the stack's NATS and monitoring ports; `None` past
/// 65535.
pub fn node_ports(nats_port: u16, monitor_port: u16, node: u16) -> Option<NodePorts> {
    let step = node.checked_sub(1)?;
    Some(NodePorts {
        client: nats_port.checked_add(step)?,
        monitor: monitor_port.checked_add(step)?,
        route: nats_port.checked_add(ROUTE_OFFSET)?.checked_add(step)?,
    })
}

/// Every node's ports; `None` if one would pass 65535.
pub fn all_node_ports(nats_port: u16, monitor_port: u16, nodes: u16) -> Option<Vec<NodePorts>> {
    (1..=nodes)
        .map(|i| node_ports(nats_port, monitor_port, i))
        .collect()
}

/// `up`'s check of a cluster's ports (a single server's are checked by `layout::up_ports`): all
/// below 65536, none taken twice, none Postgres'.
pub fn check_ports(nats_port: u16, monitor_port: u16, pg_port: u16, nodes: u16) -> Result<()> {
    if nodes <= 1 {
        return Ok(());
    }
    let last = nodes - 1;
    let span = |first: u32| format!("{first}-{}", first + u32::from(last));
    let problem = || {
        Error::Invalid(format!(
            "a NATS cluster of {nodes} ({CLUSTER_VAR}) takes ports {} (clients), {} (monitoring) and {} (routes): they must be below 65536, apart from each other and from Postgres' {pg_port}",
            span(u32::from(nats_port)),
            span(u32::from(monitor_port)),
            span(u32::from(nats_port) + u32::from(ROUTE_OFFSET)),
        ))
    };
    let ports = all_node_ports(nats_port, monitor_port, nodes).ok_or_else(problem)?;
    let mut all: Vec<u16> = ports
        .iter()
        .flat_map(|p| [p.client, p.monitor, p.route])
        .chain([pg_port])
        .collect();
    let count = all.len();
    all.sort_unstable();
    all.dedup();
    if all.len() != count {
        return Err(problem());
    }
    Ok(())
}

/// What a cluster node's config adds to a single server's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// 1-based.
    pub node: u16,
    /// Every node's route port, node 1's first (this node's own among them).
    pub route_ports: Vec<u16>,
}

impl ClusterNode {
    pub fn nodes(&self) -> usize {
        self.route_ports.len()
    }

    /// This node's route port.
    pub fn route_port(&self) -> u16 {
        self.route_ports[usize::from(self.node) - 1]
    }
}

/// The name both the cluster and the server names derive from.
pub fn cluster_name(stack: &str) -> String {
    format!("switchboard-{stack}")
}

/// Node i's `server_name`: JetStream's Raft groups tell their peers apart by it, and the chaos
/// harness reads a stream leader's node from it (`switchboard-<stack>-<i>`).
pub fn server_name(stack: &str, node: u16) -> String {
    format!("switchboard-{stack}-{node}")
}

/// A node's `cluster {}` block: the cluster's name, this node's route listener and every
/// node's route (nats-server ignores the route to itself, so every node gets the same list).
/// The routes have no authorization: they listen on loopback only, as the client port does.
pub fn cluster_block(stack: &str, c: &ClusterNode) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# A JetStream cluster of {n} nodes on loopback ({CLUSTER_VAR}={n}); this is node {i}.
# Every node lists every route (its own is ignored). No route authorization: loopback only.
cluster {{
  name: \"{name}\"
  listen: \"127.0.0.1:{route}\"
  routes: [",
        n = c.nodes(),
        i = c.node,
        name = cluster_name(stack),
        route = c.route_port(),
    );
    for port in &c.route_ports {
        let _ = writeln!(out, "    \"nats-route://127.0.0.1:{port}\"");
    }
    out.push_str("  ]\n}\n");
    out
}

/// The JetStream meta leader's server name in a `/jsz` answer (`meta_cluster.leader`), for the
/// log; `None` while there is none.
pub fn meta_leader(jsz: &str) -> Option<String> {
    let meta = &jsz[jsz.find("\"meta_cluster\"")?..];
    let after_key = &meta[meta.find("\"leader\"")? + "\"leader\"".len()..];
    let value = after_key.trim_start().strip_prefix(':')?.trim_start();
    let value = value.strip_prefix('"')?;
    let leader = &value[..value.find('"')?];
    (!leader.is_empty()).then(|| leader.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_1_3_or_5() {
        assert_eq!(cluster_size(None).unwrap(), 1);
        assert_eq!(cluster_size(Some("1")).unwrap(), 1);
        assert_eq!(cluster_size(Some("3")).unwrap(), 3);
        assert_eq!(cluster_size(Some("5")).unwrap(), 5);
        for bad in ["0", "2", "4", "6", "7", "-3", "03", " 3", "three", "3.0"] {
            let e = cluster_size(Some(bad)).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert_eq!(
                e.to_string(),
                format!(
                    "SB_STACK_NATS_CLUSTER must be 1 (one NATS server, the default), 3 or 5 (a JetStream cluster of that many nodes), got '{bad}'"
                )
            );
        }
    }

    #[test]
    fn node_i_takes_the_ith_ports_and_routes_ten_above() {
        assert_eq!(
            node_ports(27222, 27322, 1),
            Some(NodePorts {
                client: 27222,
                monitor: 27322,
                route: 27232
            })
        );
        assert_eq!(
            node_ports(27222, 27322, 3),
            Some(NodePorts {
                client: 27224,
                monitor: 27324,
                route: 27234
            })
        );
        assert_eq!(node_ports(27222, 27322, 0), None);
        assert_eq!(node_ports(65530, 27322, 1), None, "route past 65535");
        let all = all_node_ports(14222, 15222, 5).unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[4].client, 14226);
        assert_eq!(all[4].route, 14236);
        assert_eq!(all_node_ports(65533, 1024, 3), None);
    }

    #[test]
    fn a_clusters_ports_must_fit_and_not_collide() {
        check_ports(27222, 27322, 27432, 3).unwrap();
        check_ports(14222, 15222, 15432, 5).unwrap();
        check_ports(18222, 19222, 19432, 3).unwrap();
        // A single server keeps the checks it always had (no route port).
        check_ports(65535, 1024, 2000, 1).unwrap();
        for (nats, monitor, pg) in [
            (27222, 27223, 27432), // monitoring on node 2's client port
            (27222, 27322, 27224), // Postgres on node 3's client port
            (27222, 27322, 27233), // Postgres on node 2's route port
            (27222, 27232, 27432), // monitoring on the route ports
            (65534, 1024, 2000),   // past 65535
        ] {
            let e = check_ports(nats, monitor, pg, 3).unwrap_err().to_string();
            assert!(e.starts_with("a NATS cluster of 3"), "{e}");
        }
        let e = check_ports(27222, 27223, 27432, 3).unwrap_err().to_string();
        assert_eq!(
            e,
            "a NATS cluster of 3 (SB_STACK_NATS_CLUSTER) takes ports 27222-27224 (clients), 27223-27225 (monitoring) and 27232-27234 (routes): they must be below 65536, apart from each other and from Postgres' 27432"
        );
    }

    #[test]
    fn the_cluster_block_lists_every_route() {
        let node = ClusterNode {
            node: 2,
            route_ports: vec![27232, 27233, 27234],
        };
        assert_eq!(node.route_port(), 27233);
        assert_eq!(
            cluster_block("chaos", &node),
            "# A JetStream cluster of 3 nodes on loopback (SB_STACK_NATS_CLUSTER=3); this is node 2.
# Every node lists every route (its own is ignored). No route authorization: loopback only.
cluster {
  name: \"switchboard-chaos\"
  listen: \"127.0.0.1:27233\"
  routes: [
    \"nats-route://127.0.0.1:27232\"
    \"nats-route://127.0.0.1:27233\"
    \"nats-route://127.0.0.1:27234\"
  ]
}
"
        );
        assert_eq!(server_name("chaos-small", 3), "switchboard-chaos-small-3");
    }

    #[test]
    fn the_meta_leader_is_read_from_jsz() {
        let jsz = r#"{
  "server_id": "N1",
  "meta_cluster": {
    "name": "switchboard-x",
    "leader": "switchboard-x-2",
    "peer": "abc",
    "cluster_size": 3
  }
}"#;
        assert_eq!(meta_leader(jsz).as_deref(), Some("switchboard-x-2"));
        assert_eq!(
            meta_leader(r#"{"meta_cluster":{"leader":"a-1"}}"#).as_deref(),
            Some("a-1")
        );
        assert_eq!(meta_leader(r#"{"meta_cluster":{"name":"x"}}"#), None);
        assert_eq!(meta_leader(r#"{"meta_cluster":{"leader":""}}"#), None);
        assert_eq!(meta_leader(r#"{"leader":"not-meta"}"#), None);
    }
}
